#include "cli/template_flags.h"

#include <fstream>
#include <iterator>

#include <fmt/core.h>

namespace trellis::cli {

Result<server::ChatTemplate> PickTemplate(const std::string& chat_template, const Model& model, const Tokenizer& tok,
                                          std::string& source) {
  server::TemplateTokens t;
  t.bos = tok.bos_id() >= 0 ? std::string(tok.TokenText(tok.bos_id())) : "";
  t.eos = tok.eos_id() >= 0 ? std::string(tok.TokenText(tok.eos_id())) : "";
  if (!chat_template.empty()) {
    auto named = server::ChatTemplate::FromName(chat_template, t);
    if (named.ok()) {
      source = "--chat-template " + chat_template;
      return named;
    }
    std::ifstream f(chat_template, std::ios::binary);
    if (!f) {
      return InvalidArgument(fmt::format("--chat-template '{}' is neither a template name ({}) nor a readable file",
                                         chat_template, server::ChatTemplate::KnownNames()));
    }
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (text.size() > jinja::Template::kMaxSourceBytes) return InvalidArgument(fmt::format("{}: template too large", chat_template));
    source = "--chat-template " + chat_template;
    auto r = server::ChatTemplate::FromJinja(text, t);
    if (!r.ok()) return r.status().WithContext(chat_template);
    return r;
  }
  auto jinja = model.gguf().GetString("tokenizer.chat_template");
  if (jinja.ok()) {
    source = "tokenizer.chat_template";
    return server::ChatTemplate::FromJinja(*jinja, t);
  }
  source = "default: the model has no tokenizer.chat_template";
  return server::ChatTemplate::FromName("zephyr", t);
}

}  // namespace trellis::cli
