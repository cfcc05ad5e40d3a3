// The chat template a command uses (serve, chat): --chat-template NAME|FILE, else the
// model's own, else a default.
#pragma once

#include <string>

#include "engine/model.h"
#include "model/tokenizer.h"
#include "server/chat_template.h"
#include "util/status.h"

namespace trellis::cli {

// --chat-template NAME (a built-in family, server::ChatTemplate::KnownNames) or FILE (a
// Jinja template), else the GGUF's tokenizer.chat_template run by the Jinja interpreter,
// else zephyr (the default model's vocab is TinyLlama's, whose chat model uses zephyr).
// *source says which, for the start-up banner. Errors name the template's line and the
// construct it could not handle.
Result<server::ChatTemplate> PickTemplate(const std::string& chat_template, const Model& model, const Tokenizer& tok,
                                          std::string& source);

}  // namespace trellis::cli
