// Numbers in JSON Schema grammars, internal to json_schema.cc: bounds read as exact
// decimals, and the GBNF of the integers and fractions between two bounds (minimum,
// maximum, exclusive ones), each level of digits following the bounds' next digit so the
// grammar's size is linear in their lengths.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace trellis::grammar::schema_numbers {

using json = nlohmann::ordered_json;

inline constexpr size_t kIntDigits = 20;   // the grammar's json-int: at most 20 digits
inline constexpr size_t kFracDigits = 20;  // and at most 20 fraction digits

// A JSON number bound as exact decimal digits: -12.5 is {neg, "12", "5"}. The integer
// digits have no leading zeros ("0" for none), the fraction no trailing zeros; zero is
// never negative. Bounds are read from the schema's own spelling of the number (1.1 is
// 1.1, not the double nearest it), as validators compare them.
struct Decimal {
  bool neg = false;
  std::string i = "0", f;
};

// -1, 0, 1 as a < b, a == b, a > b.
int Compare(const Decimal& a, const Decimal& b);
// The schema's spelling of number v as a Decimal; nullopt if it is not a number.
std::optional<Decimal> ToDecimal(const json& v);
// n + 1 and n - 1 of a digit string (n - 1: n > 0).
std::string Increment(std::string n);
std::string Decrement(std::string n);
// "[lo-hi]", and min..max more digits.
std::string DigitClass(char lo, char hi);
std::string AnyDigits(size_t min, size_t max);
// Integers from a to b of the same length.
std::string SameLength(const std::string& a, const std::string& b);
// "abc" as a GBNF literal of the same bytes.
std::string Literal(std::string_view s);
// Non-negative numbers in [lo, hi] (either open, either strict), integer digits then an
// optional fraction (none when integer); nullopt when there are none.
std::optional<std::string> Magnitude(const std::optional<Decimal>& lo, bool lo_strict, const std::optional<Decimal>& hi,
                                     bool hi_strict, bool integer);
// Integers from a to b (b open: up to kIntDigits digits), no leading zeros.
std::string IntRange(const std::string& a, const std::optional<std::string>& b);
std::optional<std::string> FractionPart(std::optional<std::string> lo, bool ls, const std::optional<std::string>& hi,
                                        bool hs, bool integer);
std::optional<std::string> FractionDigits(const std::optional<std::string>& lo, bool ls,
                                          const std::optional<std::string>& hi, bool hs, size_t room);

}  // namespace trellis::grammar::schema_numbers
