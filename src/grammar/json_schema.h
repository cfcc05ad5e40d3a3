// JSON Schema to grammar: the documents a schema accepts, as GBNF, so that constrained
// decoding can only write valid instances.
//
// Supported (what OpenAI's strict mode allows, and more): type (one or a list), enum,
// const, properties, required, additionalProperties (false, true or a schema; absent means
// true, as the specification says), items, prefixItems, minItems, maxItems, string
// minLength / maxLength, format date / time / date-time / uuid / email / ipv4, string
// pattern (regex.h's syntax, matched anywhere in the string unless anchored, alone: not
// beside format or the lengths), anyOf, and
// oneOf whose branches surely exclude each other (different types, disjoint const/enum
// values, or objects with a required const discriminator; other oneOfs are refused, since
// a grammar cannot exclude a value matching two branches), with keywords beside them
// applied to every branch, allOf (the parts' keywords merged; a
// keyword in two parts is refused), additionalItems with draft-7 tuple `items`, $ref to
// any JSON pointer inside the schema ("#", "#/$defs/...", ...; recursion allowed),
// numbers and integers within minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (numbers, or draft 4's booleans; the bounds read as the exact decimals the schema
// spells, so 0.1 is one tenth), multipleOf (integer or decimal; alone, or with minimum 0:
// a remainder automaton over the digits, at most 2048 states; its integer digits are not
// bounded as other numbers' are, so a weak model may run to max_tokens), boolean schemas, and the annotations (title, description, default, examples, $schema,
// $id, $comment, deprecated, readOnly, writeOnly, strict), which change nothing.
//
// Everything else that constrains a value (multipleOf beside other bounds,
// uniqueItems: true, not, if / then / else, patternProperties, propertyNames, contains,
// min/maxProperties, dependentRequired, other formats, remote $refs, unknown keywords) is
// refused with
// Unsupported naming the keyword and where it sits: a schema is honoured completely or not
// at all.
//
// The grammar writes objects with their declared properties in declaration order
// (required ones always, optional ones or not), then any additional ones; numbers with at
// most 20 integer digits, 20 fraction digits and 3 exponent digits (no exponent where
// bounds apply: every plain decimal within them is written); whitespace of at most
// one space or one line break and 20 indent characters between tokens. These bound every
// token run so that even a model with no idea of JSON ends its answer.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "util/status.h"

namespace trellis::grammar {

// GBNF for the instances of `schema` (JSON text). InvalidArgument for malformed JSON or a
// malformed schema, Unsupported for a keyword this converter does not implement; messages
// name the schema path (e.g. "/properties/age/minimum").
Result<std::string> JsonSchemaToGbnf(std::string_view schema, const GrammarLimits& limits = {});
Result<Grammar> CompileJsonSchema(std::string_view schema, const GrammarLimits& limits = {});

// Any JSON value; any JSON object (OpenAI's json_object mode).
std::string JsonValueGbnf();
std::string JsonObjectGbnf();

}  // namespace trellis::grammar
