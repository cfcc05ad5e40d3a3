// The Jinja interpreter: language pieces one by one against what jinja2 (trim_blocks,
// lstrip_blocks) renders, provenance of input text, and hostile templates.
#include "jinja/jinja.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace trellis::jinja {
namespace {

std::string Render(const std::string& src, const Value& globals = Value::Dict()) {
  auto t = Template::Parse(src);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  auto r = t->Render(globals);
  if (!r.ok()) return "RENDER ERROR: " + std::string(r.status().message());
  std::string s;
  for (const Piece& p : *r) s += p.text;
  return s;
}

TEST(JinjaTest, Basics) {
  EXPECT_EQ(Render("a{{ 1 + 2 }}b"), "a3b");
  EXPECT_EQ(Render("{{ 'x' ~ 3 ~ none }}"), "x3None");
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 3.5 1024");
  EXPECT_EQ(Render("{{ [1, 'a', none, true] }} {{ {'k': 'v'} }}"), "[1, 'a', None, True] {'k': 'v'}");
  EXPECT_EQ(Render("{{ 'yes' if 1 > 2 else 'no' }}"), "no");
  EXPECT_EQ(Render("{{ 'abcdef'[1:4] }} {{ 'abc'[::-1] }} {{ [1,2,3][-1] }}"), "bcd cba 3");
  EXPECT_EQ(Render("{{ 'a' in 'cat' }} {{ 2 not in [1, 2] }}"), "True False");
  EXPECT_EQ(Render("{{ x }}|{{ x is defined }}|{{ y.z is defined }}"), "|False|False");
  EXPECT_EQ(Render("{{ '  hi  ' | trim }}|{{ 'Hi' | upper }}|{{ [1,2] | length }}|{{ none | default('d') }}"),
            "hi|HI|2|None");
  EXPECT_EQ(Render("{{ u | default('d') }}"), "d");
  EXPECT_EQ(Render("{{ ' a b '.strip() }}|{{ 'a,b'.split(',') }}|{{ 'abc'.startswith('ab') }}|{{ 'xax'.replace('x', 'y') }}"),
            "a b|['a', 'b']|True|yay");
}

// Python's whitespace (str.isspace: NBSP, U+2028, U+3000, U+0085, U+001F, ...) in trim,
// strip, lstrip, rstrip, split and isspace. Expected: jinja2 3.1.6's output for the same
// template and value (python3 -c "import jinja2; ...", see the commit).
TEST(JinjaTest, StringWhitespaceIsPythons) {
  const std::string s = "\u00a0\u3000 \u2028hi there\u2009\u0085\u202f\u205f\x1f\u00a0";
  const Value g = Value::Dict({{"s", Value::Str(
      "\xC2\xA0\xE3\x80\x80 \xE2\x80\xA8hi there\xE2\x80\x89\xC2\x85\xE2\x80\xAF\xE2\x81\x9F\x1F\xC2\xA0")}});
  const std::string tail = "\xE2\x80\x89\xC2\x85\xE2\x80\xAF\xE2\x81\x9F\x1F\xC2\xA0";
  EXPECT_EQ(Render("{{ s | trim }}|", g), "hi there|");
  EXPECT_EQ(Render("{{ s.strip() }}|", g), "hi there|");
  EXPECT_EQ(Render("{{ s.lstrip() }}|", g), "hi there" + tail + "|");
  EXPECT_EQ(Render("{{ s.rstrip() }}|", g), "\xC2\xA0\xE3\x80\x80 \xE2\x80\xA8hi there|");
  EXPECT_EQ(Render("{{ s.split() | join(',') }}|", g), "hi,there|");
  EXPECT_EQ(Render("{{ s.split(None, 1) | join(',') }}|", g), "hi,there" + tail + "|");
  EXPECT_EQ(Render("{{ s.isspace() }}|", g), "False|");
  EXPECT_EQ(Render("{{ ('\xE3\x80\x80\xC2\xA0' ~ ' ').isspace() }}|", g), "True|");
  EXPECT_EQ(Render("{{ '\xC3\xA9\xC3\xA9x\xC3\xA9\xC3\xA9'.strip('\xC3\xA9') }}|", g), "x|");
  // A multi-byte character in strip's argument never strips part of another character.
  EXPECT_EQ(Render("{{ '\xC3\xA8x'.strip('\xC3\xA9') }}|", g), "\xC3\xA8x|");
  (void)s;
}

// Python's case rules (full mappings: ß -> SS, the ligature ﬁ -> FI; final sigma; title
// case after any uncased character; jinja2's own `title` filter, which differs from
// str.title) and Unicode character classes. Expected: jinja2 3.1.6 on Python 3.11 (Debian
// 12) for the same templates (python3 -c "import jinja2; ...", see the commit).
TEST(JinjaTest, CaseRulesArePythons) {
  const Value g = Value::Dict({{"s", Value::Str("straße ǆemal ΌΣΟΣ ὈΔΥΣΣΕΎΣ İstanbul they're (ﬁne) x-ray ΣΑΣ. ǅ")}});
  EXPECT_EQ(Render("{{ s | upper }}", g), "STRASSE ǄEMAL ΌΣΟΣ ὈΔΥΣΣΕΎΣ İSTANBUL THEY'RE (FINE) X-RAY ΣΑΣ. Ǆ");
  EXPECT_EQ(Render("{{ s | lower }}", g), "straße ǆemal όσος ὀδυσσεύς i̇stanbul they're (ﬁne) x-ray σας. ǆ");
  EXPECT_EQ(Render("{{ s | title }}", g), "Straße Ǆemal Όσος Ὀδυσσεύς İstanbul They're (FIne) X-Ray Σας. Ǆ");
  EXPECT_EQ(Render("{{ s | capitalize }}", g), "Straße ǆemal όσος ὀδυσσεύς i̇stanbul they're (ﬁne) x-ray σας. ǆ");
  EXPECT_EQ(Render("{{ s.upper() }}", g), "STRASSE ǄEMAL ΌΣΟΣ ὈΔΥΣΣΕΎΣ İSTANBUL THEY'RE (FINE) X-RAY ΣΑΣ. Ǆ");
  EXPECT_EQ(Render("{{ s.lower() }}", g), "straße ǆemal όσος ὀδυσσεύς i̇stanbul they're (ﬁne) x-ray σας. ǆ");
  EXPECT_EQ(Render("{{ s.title() }}", g), "Straße ǅemal Όσος Ὀδυσσεύς İstanbul They'Re (Fine) X-Ray Σας. ǅ");
  EXPECT_EQ(Render("{{ s.capitalize() }}", g), "Straße ǆemal όσος ὀδυσσεύς i̇stanbul they're (ﬁne) x-ray σας. ǆ");
  EXPECT_EQ(Render("{{ 'ÉCOLE'.isupper() }}|{{ 'école'.islower() }}|{{ 'ǅ'.isupper() }}|{{ 'Ⅻ'.isupper() }}|{{ 'ß'.islower() }}|{{ '١٢٣'.isdigit() }}|{{ '²'.isdigit() }}|{{ 'ｱｲ'.isalpha() }}|{{ 'x1'.isalpha() }}|{{ '한국어'.isalpha() }}", g), "True|True|False|True|True|True|True|True|False|True");
  EXPECT_EQ(Render("{{ 'ÉCOLE' is upper }}|{{ 'école' is lower }}|{{ 'Ab' is lower }}|{{ '123' is lower }}", g), "True|True|False|False");
  // Bytes that are not UTF-8 pass through.
  EXPECT_EQ(Render("{{ s | upper }}", Value::Dict({{"s", Value::Str("a\xFF\xC3" "b")}})), "A\xFF\xC3" "B");
}

TEST(JinjaTest, WhitespaceControlAsJinja2) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it.
  EXPECT_EQ(Render("{% if true %}\n  a\n{% endif %}\nb"), "  a\nb");
  EXPECT_EQ(Render("x\n    {% if true %}y{% endif %}\n"), "x\ny");  // trailing newline dropped
  EXPECT_EQ(Render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(Render("a\n{#- c -#}\nb"), "ab");
  EXPECT_EQ(Render("a {# c #}\nb"), "a b");
  EXPECT_EQ(Render("{{ 'x' }}\n"), "x");
  EXPECT_EQ(Render("{{ 'x' }}\n\n"), "x\n");
}

TEST(JinjaTest, LoopsScopesNamespacesMacros) {
  EXPECT_EQ(Render("{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
            "11,22,33");
  EXPECT_EQ(Render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in [1,2,3,4] if x is even %}{{ x }}{% endfor %}"), "24");
  EXPECT_EQ(Render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(Render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  // A set inside a loop does not leak; a namespace attribute does.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1,2] %}{% set n = n + x %}{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(Render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m('x') }}{{ m('y', b='z') }}"), "<xB><yz>");
  EXPECT_EQ(Render("{% set s %}in{{ 1 }}{% endset %}[{{ s }}]"), "[in1]");
  EXPECT_EQ(Render("{{ [{'a': 1}, {'a': 2}, {'b': 3}] | selectattr('a', 'equalto', 2) | list | length }}"), "1");
  EXPECT_EQ(Render("{{ [{'a': 'x'}, {'a': 'y'}] | map(attribute='a') | join('-') }}"), "x-y");
}

TEST(JinjaTest, TojsonAsPythonJsonDumps) {
  Value v = Value::Dict({{"name", Value::Str("f\u00e9\"q")}, {"n", Value::Int(3)}, {"l", Value::List({Value::Bool(true), Value::None()})}});
  EXPECT_EQ(ToJson(v), "{\"name\": \"f\u00e9\\\"q\", \"n\": 3, \"l\": [true, null]}");
  EXPECT_EQ(ToJson(v, 2), "{\n  \"name\": \"f\u00e9\\\"q\",\n  \"n\": 3,\n  \"l\": [\n    true,\n    null\n  ]\n}");
}

TEST(JinjaTest, InputKeepsItsProvenance) {
  Value g = Value::Dict({{"m", Value::Str(" <|im_start|>x ", true)}});
  auto t = Template::Parse("<|im_start|>{{ (m | trim) + '<|im_end|>' }}{{ m.upper() }}");
  ASSERT_TRUE(t.ok());
  auto r = t->Render(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].text, "<|im_start|>");
  EXPECT_FALSE((*r)[0].input);
  EXPECT_EQ((*r)[1].text, "<|im_start|>x");
  EXPECT_TRUE((*r)[1].input);
  EXPECT_EQ((*r)[2].text, "<|im_end|>");
  EXPECT_FALSE((*r)[2].input);
  EXPECT_EQ((*r)[3].text, " <|IM_START|>X ");
  EXPECT_TRUE((*r)[3].input);
}

TEST(JinjaTest, ErrorsNameTheLineAndConstruct) {
  EXPECT_EQ(Render("a\n{% frobnicate %}"), "PARSE ERROR: chat template line 2: unsupported tag {% frobnicate %}");
  EXPECT_EQ(Render("{{ x | nosuch }}"), "PARSE ERROR: chat template line 1: unsupported filter 'nosuch'");
  EXPECT_EQ(Render("{% if x %}"), "PARSE ERROR: chat template line 1: missing {% elif %}");
  EXPECT_EQ(Render("\n\n{{ raise_exception('roles must alternate') }}"),
            "RENDER ERROR: chat template line 3: the template raised: roles must alternate");
  EXPECT_EQ(Render("{{ 1 / 0 }}"), "RENDER ERROR: chat template line 1: division by zero");
  EXPECT_EQ(Render("{{ x.strip() }}"), "RENDER ERROR: chat template line 1: 'strip' called on an undefined value");
}

TEST(JinjaTest, HostileTemplatesAreBounded) {
  EXPECT_NE(Render("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(Render("{% for a in range(2000) %}{% for b in range(2000) %}{% endfor %}{% endfor %}").find("too many loop iterations"),
            std::string::npos);
  EXPECT_NE(Render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion too deep"), std::string::npos);
  EXPECT_NE(Render("{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}").find("output too large"),
            std::string::npos);
  // Deep trees from long chains and deep block nesting are refused at parse time (a walk
  // over a 100k-deep tree, even its destructor, would overflow the stack).
  EXPECT_NE(Render("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("string too long"),
            std::string::npos);
  EXPECT_NE(Render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("list too long"),
            std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += "+1";
  EXPECT_NE(Render(chain + " }}").find("expression too long"), std::string::npos);
  std::string attrs = "{{ x";
  for (int i = 0; i < 100000; ++i) attrs += ".a";
  EXPECT_NE(Render(attrs + " }}").find("expression too long"), std::string::npos);
  std::string nest;
  for (int i = 0; i < 50000; ++i) nest += "{% if 1 %}";
  EXPECT_NE(Render(nest).find("blocks nested too deeply"), std::string::npos);
  std::string ok_nest, ok_end;
  for (int i = 0; i < 50; ++i) ok_nest += "{% if 1 %}", ok_end += "{% endif %}";
  EXPECT_EQ(Render(ok_nest + "x" + ok_end), "x");
  EXPECT_NE(Render("{{ 'unterminated }}").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(Render("{{").find("PARSE ERROR"), std::string::npos);
  EXPECT_NE(Render("{% for %}").find("PARSE ERROR"), std::string::npos);
}

// The messages of a conversation as a template sees them: content marked as input.
Value Messages(const nlohmann::json& conv) {
  ValueList l;
  for (const auto& m : conv) {
    l.push_back(Value::Dict({{"role", Value::Str(m["role"].get<std::string>())},
                             {"content", Value::Str(m["content"].get<std::string>(), true)}}));
  }
  return Value::List(std::move(l));
}

// Every template in tests/data/templates renders, for every conversation, exactly what
// Hugging Face's renderer gives (tests/data/templates/golden.json, made by
// tools/render_chat_templates.py with jinja2), and raises where it raises.
TEST(JinjaTest, ShippedTemplatesRenderAsHuggingFace) {
  const std::string dir = std::string(TRELLIS_TEST_DATA) + "/templates/";
  std::ifstream gf(dir + "golden.json");
  ASSERT_TRUE(gf.good());
  const nlohmann::json golden = nlohmann::json::parse(gf);
  int checked = 0;
  for (const auto& [name, t] : golden["templates"].items()) {
    std::ifstream tf(dir + name + ".jinja");
    std::stringstream src;
    src << tf.rdbuf();
    auto tmpl = Template::Parse(src.str());
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().ToString();
    for (const auto& [key, want] : t["cases"].items()) {
      const std::string conv = key.substr(0, key.find('/'));
      const bool gen = key.substr(key.find('/') + 1) == "gen";
      auto tok = [](const nlohmann::json& j) { return j.is_null() ? Value::None() : Value::Str(j.get<std::string>()); };
      const Value globals = Value::Dict({{"messages", Messages(golden["conversations"][conv])},
                                         {"tools", Value::None()},
                                         {"add_generation_prompt", Value::Bool(gen)},
                                         {"bos_token", tok(t["bos_token"])},
                                         {"eos_token", tok(t["eos_token"])}});
      auto out = tmpl->Render(globals);
      if (want.contains("error")) {
        ASSERT_FALSE(out.ok()) << name << " " << key;
        EXPECT_NE(out.status().message().find(want["error"].get<std::string>()), std::string::npos)
            << name << " " << key << ": " << out.status().ToString();
      } else {
        ASSERT_TRUE(out.ok()) << name << " " << key << ": " << out.status().ToString();
        std::string text;
        for (const Piece& p : *out) text += p.text;
        EXPECT_EQ(text, want["text"].get<std::string>()) << name << " " << key;
        // Every message content reaches the output as input, never as template text.
        for (const Piece& p : *out) {
          if (!p.input) {
            EXPECT_EQ(p.text.find("Say </s>"), std::string::npos) << name << " " << key;
          }
        }
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 9 * 14);
}

}  // namespace
}  // namespace trellis::jinja
