// The syntax tree: what the parser (parser.h) builds and the renderer (runtime.h) walks.
// Internal to src/jinja. A Node is a statement or an expression; by kind it holds
//   kBody      kids: the statements
//   kText      name: the text
//   kOutput    kids: the expression in {{ }}
//   kIf        kids: condition, body, condition, body, ... then the else body (flag)
//   kFor       names: the targets; kids: iterable, loop filter (or null), body, else body (flag)
//   kSet       names: the targets; kids: the value
//   kSetAttr   names: the namespace; name: the attribute; kids: the value
//   kSetBlock  name: the variable; kids: the body
//   kMacro     name; names: the parameters; kw: their defaults (null for none); kids: the body
//   kCallBlock kids: the macro call, the body (caller())
//   kLiteral   value
//   kName      name
//   kAttr      name: the attribute; kids: the object
//   kItem      kids: the object, the key
//   kSlice     kids: the object, start, stop, step (each null when absent)
//   kCall      kids: the callee, the positional arguments; kw / names2: keyword arguments
//   kFilter    name; kids: the value, the arguments; kw / names2: keyword arguments
//   kTest      name; flag: negated; kids: the value, the arguments
//   kUnary, kBinary   name: the operator; kids: the operands
//   kAnd, kOr, kNot   kids: the operands
//   kCond      kids: condition, value, else value (or null)
//   kList, kTuple     kids: the items
//   kDict      kids: key, value, key, value, ...
//
// Thread safety: a tree is immutable once parsed and shared by the Templates holding it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "jinja/jinja.h"

namespace trellis::jinja {

struct Node {
  enum class K {
    // statements
    kBody, kText, kOutput, kIf, kFor, kSet, kSetAttr, kSetBlock, kMacro, kBreak, kContinue, kCallBlock,
    // expressions
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary, kAnd, kOr, kNot, kCond,
    kList, kDict, kTuple,
  };
  K k;
  int line = 0;
  std::string name;              // identifier / operator / filter / test / attribute
  Value value;                   // literal
  std::vector<std::shared_ptr<const Node>> kids;
  std::vector<std::string> names;  // for targets, macro parameters
  std::vector<std::shared_ptr<const Node>> kw;  // keyword argument values (kwnames in names2)
  std::vector<std::string> names2;
  bool flag = false;             // kTest: negated; kFor: has else; kIf: has else; kSlice: parts present
};

using NodeP = std::shared_ptr<const Node>;

}  // namespace trellis::jinja
