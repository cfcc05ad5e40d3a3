// The lexer: a template's source to tokens, with jinja2's whitespace rules as Hugging
// Face's apply_chat_template sets them: trim_blocks (one newline after a block or comment
// tag dropped), lstrip_blocks (spaces and tabs before one on its line dropped), '-' and '+'
// control, the one trailing newline dropped, \r\n and \r read as \n; {% raw %} text kept
// verbatim and comments dropped. Internal to src/jinja.
//
// Tokens: the text between tags is one kText; a {{ }} or {% %} tag is its begin token,
// then names, literals (strings with their escapes resolved, ints, floats) and operators,
// then its end token; kEnd closes the list. Errors are InvalidArgument naming the line
// (SyntaxError), also used by the parser.
//
// Thread safety: a function of its argument.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trellis::jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok kind;
  std::string text;  // text, name, string value, operator
  int line;
  int64_t i = 0;
  double f = 0;
};

// InvalidArgument "chat template line N: what".
Status SyntaxError(int line, const std::string& what);

// The tokens of a template's source.
Result<std::vector<Token>> Lex(std::string_view source);

}  // namespace trellis::jinja
