// The parser: tokens (lexer.h) to a syntax tree (ast.h) by recursive descent, with Python's
// operator precedence. What the renderer does not have (a tag, filter or test it does not
// know) is refused here, naming the line and the construct, and what a hostile template
// could make deep is bounded: block nesting, expression nesting (Template::kMaxDepth) and
// operator chains in one tag. Internal to src/jinja.
//
// Thread safety: functions of their arguments; the name tables are immutable.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"
#include "util/status.h"

namespace trellis::jinja {

// The filters and tests the renderer implements (the keys; the values are unused). The
// renderer checks names given at render time against them too: map('f'), select('t').
const std::unordered_map<std::string, int>& KnownFilters();
const std::unordered_map<std::string, int>& KnownTests();

// The tree of a template from its tokens; InvalidArgument naming the line on an error.
Result<NodeP> ParseTokens(std::vector<Token> tokens);

}  // namespace trellis::jinja
