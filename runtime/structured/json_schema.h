#pragma once
// JSON Schema -> GBNF, for structured outputs (OpenAI's response_format {"type": "json_schema"}
// and {"type": "json_object"}). The grammar is compiled by runtime/structured/grammar.h and constrains
// decoding so that the model can only write JSON valid under the schema.
//
// Every text the grammar matches parses with nlohmann::json::parse and is valid under the
// schema (but for `oneOf`, below); where exactness would cost a huge or very ambiguous grammar
// it accepts less than the schema allows, in these documented ways:
//  - an object's properties come in the order of `properties`, each at most once;
//  - numbers have at most 16 integer digits, 16 fraction digits and a 2-digit exponent; an
//    integer is written without fraction or exponent (so 1.0 is not an integer here);
//  - strings and keys are written as the schema spells them (an enum value is the exact text
//    nlohmann::json::dump() writes for it: `{"a":1}`, `1.5`, `"\u0001"`);
//  - whitespace between tokens is nothing, one space, or a newline and up to 20 spaces/tabs;
//    there is none before or after the top-level value;
//  - `oneOf` is treated as `anyOf` (a text matching two branches is accepted);
//  - `minimum: 0` on a number excludes "-0".
//
// Supported: type (one or a list; absent: inferred from the keywords present, else any value),
// properties, required, additionalProperties (false; true or a schema only without
// properties, i.e. a map), minProperties/maxProperties (when implied by required/properties,
// or on maps: minProperties <= 1 and any maxProperties <= 1000), items, prefixItems,
// minItems/maxItems (<= 1000), uniqueItems (false, or with maxItems <= 1), minLength/maxLength
// (<= 10000), format (date, time, date-time, uuid, ipv4), enum, const, minimum (0 on numbers
// and integers, 1 on integers), exclusiveMinimum (0 on integers), anyOf, oneOf, allOf (one
// element), $ref (local JSON pointers: "#", "#/$defs/NAME", "#/definitions/NAME", ...; each
// target becomes one rule, so recursive schemas work), nullable (OpenAPI) and the annotations
// title, description, default, examples, $schema, $id, $comment, deprecated, readOnly,
// writeOnly (ignored). Keywords that constrain another type than the instance's are ignored,
// as JSON Schema says ({"type": "string", "minimum": 3} is any string).
//
// A schema that refers to itself without consuming input ({"$ref": "#"} alone, or $defs that
// refer to each other in a cycle) makes a left-recursive grammar, which grammar::compile()
// refuses.
//
// Choice: when `properties` is given and `additionalProperties` is absent, no other property
// is allowed (OpenAI's strict mode requires additionalProperties: false anyway, and an open
// object cannot be matched in a fixed order). Without `properties`, an absent
// additionalProperties allows any properties (a map of JSON values), as JSON Schema says.
#include <string>

#include <nlohmann/json.hpp>

namespace tandem {

// GBNF text (root rule `root`) that matches exactly the JSON texts valid under `schema`
// (within the limits above). Throws tandem::failure(errc::invalid_argument, message) for a
// schema it cannot honour; the message names the JSON Schema keyword (e.g. "JSON Schema
// keyword 'pattern' is not supported"). Also refused: schemas nested deeper than 64 and
// grammars over 1 MiB. A nlohmann::json object keeps its keys sorted, so the properties come
// in alphabetical order: pass the schema as parsed into an ordered_json (the overload below)
// to keep the client's order, which is the order the model is made to write them in.
std::string json_schema_to_gbnf(const nlohmann::json& schema);
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// GBNF for any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace tandem
