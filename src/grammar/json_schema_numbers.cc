#include "grammar/json_schema_numbers.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include <fmt/format.h>

namespace trellis::grammar::schema_numbers {

// "abc" as a GBNF literal of the same bytes.
std::string Literal(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Compares magnitudes.
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.i.size() != b.i.size()) return a.i.size() < b.i.size() ? -1 : 1;
  if (int c = a.i.compare(b.i)) return c < 0 ? -1 : 1;
  const size_t n = std::max(a.f.size(), b.f.size());
  for (size_t k = 0; k < n; ++k) {
    const char x = k < a.f.size() ? a.f[k] : '0', y = k < b.f.size() ? b.f[k] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

int Compare(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  const int c = CompareMagnitude(a, b);
  return a.neg ? -c : c;
}

// The number's digits as its JSON text spells them (mantissa and exponent shifted into
// place). Nullopt past 40 digits either side of the point.
std::optional<Decimal> ToDecimal(const json& v) {
  const std::string t = v.dump(-1, ' ', false, json::error_handler_t::strict);
  size_t k = 0;
  Decimal d;
  if (k < t.size() && t[k] == '-') {
    d.neg = true;
    ++k;
  }
  std::string digits;
  int point = -1;
  for (; k < t.size() && (std::isdigit(static_cast<unsigned char>(t[k])) || t[k] == '.'); ++k) {
    if (t[k] == '.') {
      point = static_cast<int>(digits.size());
    } else {
      digits += t[k];
    }
  }
  if (point < 0) point = static_cast<int>(digits.size());
  if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
    const std::string e = t.substr(k + 1);
    if (e.empty() || e.size() > 5) return std::nullopt;
    point += std::stoi(e);
  }
  if (digits.empty() || point < -40 || point > 40 + static_cast<int>(digits.size())) return std::nullopt;
  while (point < 0) {
    digits.insert(digits.begin(), '0');
    ++point;
  }
  while (point > static_cast<int>(digits.size())) digits += '0';
  d.i = digits.substr(0, point);
  d.f = digits.substr(point);
  d.i.erase(0, std::min(d.i.find_first_not_of('0'), d.i.size()));
  if (d.i.empty()) d.i = "0";
  d.f.erase(d.f.find_last_not_of('0') + 1);
  if (d.i.size() > 40 || d.f.size() > 40) return std::nullopt;
  if (d.i == "0" && d.f.empty()) d.neg = false;
  return d;
}

// n + 1 and n - 1 (n > 0) on digit strings without leading zeros.
std::string Increment(std::string n) {
  for (size_t k = n.size(); k-- > 0;) {
    if (n[k] != '9') {
      ++n[k];
      return n;
    }
    n[k] = '0';
  }
  return "1" + n;
}

std::string Decrement(std::string n) {
  for (size_t k = n.size(); k-- > 0;) {
    if (n[k] != '0') {
      --n[k];
      break;
    }
    n[k] = '9';
  }
  if (n.size() > 1 && n[0] == '0') n.erase(0, 1);
  return n;
}

std::string DigitClass(char lo, char hi) {
  return lo == hi ? fmt::format("\"{}\"", lo) : fmt::format("[{}-{}]", lo, hi);
}

std::string AnyDigits(size_t min, size_t max) {
  if (max == 0) return "";
  return min == max ? fmt::format(" [0-9]{{{}}}", min) : fmt::format(" [0-9]{{{},{}}}", min, max);
}

// Digit strings of a's length from a to b (a <= b, same length), as numbers.
std::string SameLength(const std::string& a, const std::string& b) {
  size_t p = 0;
  while (p < a.size() && a[p] == b[p]) ++p;
  std::string prefix = p > 0 ? Literal(a.substr(0, p)) : "";
  if (p == a.size()) return prefix;
  const size_t n = a.size() - p - 1;  // digits after the first that differs
  const std::string ra = a.substr(p + 1), rb = b.substr(p + 1);
  const bool a_zeros = ra.find_first_not_of('0') == std::string::npos;
  const bool b_nines = rb.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  if (!a_zeros) alts.push_back(fmt::format("\"{}\" {}", a[p], SameLength(ra, std::string(n, '9'))));
  const char lo = a_zeros ? a[p] : static_cast<char>(a[p] + 1);
  const char hi = b_nines ? b[p] : static_cast<char>(b[p] - 1);
  if (lo <= hi) alts.push_back(DigitClass(lo, hi) + AnyDigits(n, n));
  if (!b_nines) alts.push_back(fmt::format("\"{}\" {}", b[p], SameLength(std::string(n, '0'), rb)));
  std::string body;
  for (const std::string& e : alts) body += (body.empty() ? "" : " | ") + e;
  return (prefix.empty() ? "" : prefix + " ") + (alts.size() == 1 ? body : "( " + body + " )");
}

// Non-negative numbers in [lo, hi] (either open), integer digits then an optional
// fraction; nullopt when there are none.
std::optional<std::string> Magnitude(const std::optional<Decimal>& lo, bool lo_strict, const std::optional<Decimal>& hi,
                                     bool hi_strict, bool integer) {
  if (lo && lo->i.size() > kIntDigits) return std::nullopt;
  std::vector<std::string> alts;
  auto with = [&](const std::string& int_part, const std::optional<std::string>& flo, bool fls,
                  const std::optional<std::string>& fhi, bool fhs) {
    if (auto f = FractionPart(flo, fls, fhi, fhs, integer)) alts.push_back(Literal(int_part) + (f->empty() ? "" : " " + *f));
  };
  std::string start = "0";
  std::optional<std::string> end;  // the integer parts free of both bounds' fractions
  if (lo && hi && lo->i == hi->i) {
    with(lo->i, lo->f, lo_strict, hi->f, hi_strict);
  } else {
    if (lo) {
      with(lo->i, lo->f, lo_strict, std::nullopt, false);
      start = Increment(lo->i);
    }
    if (hi) {
      if (hi->i != "0") end = Decrement(hi->i);
      else end = "";  // nothing below 0
      with(hi->i, std::nullopt, false, hi->f, hi_strict);
    }
    const bool middle = !end || (!end->empty() && (start.size() < end->size() ||
                                                    (start.size() == end->size() && start <= *end)));
    if (middle && start.size() <= kIntDigits) {
      alts.push_back("( " + IntRange(start, end) + " )" +
                     (integer ? "" : fmt::format(" ( \".\" [0-9]{{1,{}}} )?", kFracDigits)));
    }
  }
  if (alts.empty()) return std::nullopt;
  std::string body;
  for (const std::string& e : alts) body += (body.empty() ? "" : " | ") + e;
  return alts.size() == 1 ? body : "( " + body + " )";
}

// Integers from a to b (b open: up to the grammar's 20 digits), no leading zeros.
std::string IntRange(const std::string& a, const std::optional<std::string>& b) {
  std::vector<std::string> alts;
  const size_t last = b ? b->size() : kIntDigits;
  for (size_t d = a.size(); d <= last; ++d) {
    if (!b && d > a.size()) {
      alts.push_back("[1-9]" + AnyDigits(d - 1, kIntDigits - 1));
      break;
    }
    const std::string lo = d == a.size() ? a : "1" + std::string(d - 1, '0');
    const std::string hi = b && d == b->size() ? *b : std::string(d, '9');
    alts.push_back(SameLength(lo, hi));
  }
  std::string body;
  for (const std::string& e : alts) body += (body.empty() ? "" : " | ") + e;
  return body;
}

// What may follow the integer digits: nothing (a fraction of zero) and/or "." and the
// fraction digits s with lo <= 0.s <= hi (strict where asked; a bound of nullopt is
// open, a bound of "" is zero). Nullopt when nothing may follow; "" when only nothing.
std::optional<std::string> FractionPart(std::optional<std::string> lo, bool ls, const std::optional<std::string>& hi,
                                        bool hs, bool integer) {
  if (lo && lo->empty() && !ls) lo.reset();  // >= 0 holds for every fraction
  if (hi && hi->empty() && hs) return std::nullopt;  // < 0: none
  const bool zero_ok = !lo && !(hi && hi->empty() && hs);
  std::optional<std::string> digits;
  if (!integer) digits = FractionDigits(lo, ls, hi, hs, kFracDigits);
  if (zero_ok && digits) return "( \".\" " + *digits + " )?";
  if (zero_ok) return std::string();
  if (digits) return "\".\" " + *digits;
  return std::nullopt;
}

// One to `room` digits s with lo <= 0.s <= hi (bounds as in FractionPart, lo never a
// non-strict zero). Each level follows the bounds' next digit, so the size is linear in
// their lengths.
std::optional<std::string> FractionDigits(const std::optional<std::string>& lo, bool ls,
                                          const std::optional<std::string>& hi, bool hs, size_t room) {
  if (room == 0) return std::nullopt;
  if (!lo && !hi) return "[0-9]" + AnyDigits(0, room - 1);
  const char l0 = lo ? (lo->empty() ? '0' : (*lo)[0]) : '0';
  const char h0 = hi ? (hi->empty() ? '0' : (*hi)[0]) : '9';
  std::vector<std::string> alts;
  char free_from = 0;  // a run of digits with no bound left
  auto flush = [&](char upto) {
    if (free_from) alts.push_back(DigitClass(free_from, upto) + AnyDigits(0, room - 1));
    free_from = 0;
  };
  for (char c = l0; c <= h0; ++c) {
    const bool on_lo = lo && c == l0, on_hi = hi && c == h0;
    if (!on_lo && !on_hi) {
      if (!free_from) free_from = c;
      continue;
    }
    flush(static_cast<char>(c - 1));
    std::optional<std::string> nlo, nhi;
    if (on_lo) nlo = lo->empty() ? "" : lo->substr(1);
    if (on_hi) nhi = hi->empty() ? "" : hi->substr(1);
    // The rest after c: empty (its value is zero) and/or more digits.
    const bool lo_open = !nlo || (nlo->empty() && !ls);
    const bool end_ok = lo_open && !(nhi && nhi->empty() && hs);
    std::optional<std::string> more;
    if (!(nhi && nhi->empty() && hs)) more = FractionDigits(lo_open ? std::nullopt : nlo, ls, nhi, hs, room - 1);
    const std::string d = fmt::format("\"{}\"", c);
    if (more && end_ok) alts.push_back(d + " ( " + *more + " )?");
    else if (more) alts.push_back(d + " " + *more);
    else if (end_ok) alts.push_back(d);
  }
  flush(h0);
  if (alts.empty()) return std::nullopt;
  std::string body;
  for (const std::string& e : alts) body += (body.empty() ? "" : " | ") + e;
  return "( " + body + " )";
}

}  // namespace trellis::grammar::schema_numbers
