// Template (jinja.h): parsing is the lexer then the parser, rendering one Renderer's walk.
#include "jinja/jinja.h"

#include <utility>
#include <vector>

#include <fmt/core.h>

#include "jinja/ast.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"

namespace trellis::jinja {

Result<Template> Template::Parse(std::string_view source) {
  if (source.size() > kMaxSourceBytes) {
    return InvalidArgument(fmt::format("chat template of {} bytes is larger than the limit of {}", source.size(), kMaxSourceBytes));
  }
  TRELLIS_ASSIGN_OR_RETURN(std::vector<Token> toks, Lex(source));
  TRELLIS_ASSIGN_OR_RETURN(NodeP root, ParseTokens(std::move(toks)));
  Template t;
  t.root_ = root;
  return t;
}

Result<std::vector<Piece>> Template::Render(const Value& globals) const {
  std::vector<Piece> out;
  Renderer r(globals);
  TRELLIS_RETURN_IF_ERROR(r.Run(*root_, &out));
  return out;
}

}  // namespace trellis::jinja
