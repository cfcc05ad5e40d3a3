// Values as the interpreter's parts see them beyond jinja.h (internal to src/jinja; include
// jinja/jinja.h instead): the function behind a callable value, and Python's view of a
// value: str() and repr(), truthiness, ==, numbers, and whether a string holds text from
// the caller's input (jinja.h, "Provenance").
//
// Thread safety: functions of their arguments; none writes to a value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "jinja/jinja.h"
#include "util/status.h"

namespace trellis::jinja {

using Kind = Value::Kind;

struct Value::Callable {
  // Positional and keyword arguments; returns the value or an error message.
  std::function<Result<Value>(std::vector<Value>&, std::vector<std::pair<std::string, Value>>&)> fn;
};

// Whether any piece of a string value came from the caller's input (false for any other kind).
bool AnyInput(const Value& v);
// A string value of one piece.
Value Flat(const std::string& s, bool input);
// str(v) as Python prints it in {{ }}: None, True, 1.0, lists and dicts as their repr.
std::string ToText(const Value& v);
// repr(v) as Python writes it ('quoted' strings, [..], {..}); at `top` a string is its text.
std::string PyRepr(const Value& v, bool top);
// bool(v) in Python: false for undefined, none, False, 0, 0.0 and empty strings, lists, dicts.
bool Truthy(const Value& v);
// int, float or bool (Python's bool is a number).
bool IsNumber(const Value& v);
double AsDouble(const Value& v);
// Python's ==: numbers by value across kinds, strings by text, lists and dicts deeply.
bool Equal(const Value& a, const Value& b);

}  // namespace trellis::jinja
