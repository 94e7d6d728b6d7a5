//! JSON Schema → GBNF, for `response_format` and `json_schema`. Covers the
//! subset structured-output clients use: `type` (object, array, string,
//! number, integer, boolean, null, or a list of them), `properties` +
//! `required` (properties in declared order, optional ones optional, no
//! additional properties unless `additionalProperties` allows them), `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `enum`, `const`,
//! `anyOf`/`oneOf`, local `$ref`s (`#/$defs/..`, `#/definitions/..`). The
//! rule shapes follow upstream's `json-schema-to-grammar`.

use std::collections::BTreeMap;

use serde_json::Value;

/// A schema outside the supported subset.
#[derive(Debug, thiserror::Error)]
#[error("unsupported JSON schema: {0}")]
pub struct SchemaError(pub String);

const SPACE: &str = r#"| " " | "\n" [ \t]{0,20}"#;

/// Rules shared by every grammar: JSON primitives and any JSON value.
fn primitive(name: &str) -> Option<&'static str> {
    Some(match name {
        "space" => SPACE,
        "boolean" => r#"("true" | "false") space"#,
        "null" => r#""null" space"#,
        "char" => r#"[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})"#,
        "string" => r#""\"" char* "\"" space"#,
        "integral-part" => r#"[0] | [1-9] [0-9]{0,15}"#,
        "decimal-part" => r#"[0-9]{1,16}"#,
        "integer" => r#"("-"? integral-part) space"#,
        "number" => r#"("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space"#,
        "value" => r#"object | array | string | number | boolean | null"#,
        "object" => r#""{" space ( string ":" space value ("," space string ":" space value)* )? "}" space"#,
        "array" => r#""[" space ( value ("," space value)* )? "]" space"#,
        _ => return None,
    })
}

fn deps(name: &str) -> &'static [&'static str] {
    match name {
        "boolean" | "null" => &["space"],
        "string" => &["char", "space"],
        "integer" => &["integral-part", "space"],
        "number" => &["integral-part", "decimal-part", "space"],
        "value" => &["object", "array", "string", "number", "boolean", "null"],
        "object" => &["string", "value", "space"],
        "array" => &["value", "space"],
        _ => &[],
    }
}

/// A GBNF string literal for `s`.
fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

struct Converter<'a> {
    root: &'a Value,
    rules: BTreeMap<String, String>,
    refs_in_progress: Vec<String>,
}

impl<'a> Converter<'a> {
    fn use_primitive(&mut self, name: &str) -> String {
        if !self.rules.contains_key(name) {
            if let Some(body) = primitive(name) {
                self.rules.insert(name.to_string(), body.to_string());
                for d in deps(name) {
                    self.use_primitive(d);
                }
            }
        }
        name.to_string()
    }

    fn add_rule(&mut self, name: &str, body: String) -> String {
        let base: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
            .collect();
        let base = if base.is_empty() { "r".to_string() } else { base };
        let mut key = base.clone();
        let mut i = 0;
        while let Some(existing) = self.rules.get(&key) {
            if *existing == body {
                return key;
            }
            i += 1;
            key = format!("{base}{i}");
        }
        self.rules.insert(key.clone(), body);
        key
    }

    fn resolve_ref(&self, r: &str) -> Result<&'a Value, SchemaError> {
        let path = r
            .strip_prefix("#/")
            .ok_or_else(|| SchemaError(format!("only local $refs are supported, not {r}")))?;
        let mut cur = self.root;
        for part in path.split('/') {
            cur = cur
                .get(part)
                .ok_or_else(|| SchemaError(format!("$ref {r} does not resolve")))?;
        }
        Ok(cur)
    }

    fn const_rule(&mut self, v: &Value) -> String {
        self.use_primitive("space");
        format!("{} space", literal(&v.to_string()))
    }

    /// The GBNF expression for `schema`; `name` seeds rule names.
    fn visit(&mut self, schema: &'a Value, name: &str) -> Result<String, SchemaError> {
        self.visit_as(schema, name, None)
    }

    /// As `visit`, with `type` forced to `forced` (one entry of a type list).
    fn visit_as(&mut self, schema: &'a Value, name: &str, forced: Option<&str>) -> Result<String, SchemaError> {
        let obj = match schema {
            Value::Bool(true) => return Ok(self.use_primitive("value")),
            Value::Bool(false) => return Err(SchemaError("`false` schema".into())),
            Value::Object(o) => o,
            _ => return Err(SchemaError("a schema must be an object".into())),
        };
        if let Some(Value::String(r)) = obj.get("$ref") {
            if self.refs_in_progress.iter().any(|x| x == r) {
                return Err(SchemaError(format!("recursive $ref {r} is not supported")));
            }
            self.refs_in_progress.push(r.clone());
            let target = self.resolve_ref(r)?;
            let ref_name = r.rsplit('/').next().unwrap_or("ref").to_string();
            let body = self.visit(target, &ref_name);
            self.refs_in_progress.pop();
            let body = body?;
            return Ok(self.add_rule(&ref_name, body));
        }
        if let Some(v) = obj.get("const") {
            return Ok(self.const_rule(v));
        }
        if let Some(Value::Array(vals)) = obj.get("enum") {
            if vals.is_empty() {
                return Err(SchemaError("empty enum".into()));
            }
            let alts: Vec<String> = vals.iter().map(|v| format!("({})", self.const_rule(v))).collect();
            return Ok(format!("({})", alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(alts)) = obj.get(key) {
                let mut out = Vec::new();
                for (i, a) in alts.iter().enumerate() {
                    let e = self.visit(a, &format!("{name}-{i}"))?;
                    out.push(self.add_rule(&format!("{name}-{i}"), e));
                }
                return Ok(format!("({})", out.join(" | ")));
            }
        }
        if let Some(Value::Array(all)) = obj.get("allOf") {
            if all.len() == 1 {
                return self.visit(&all[0], name);
            }
            return Err(SchemaError("allOf with several schemas is not supported".into()));
        }
        let ty = match (forced, obj.get("type")) {
            (Some(t), _) => Some(t.to_string()),
            (None, Some(Value::String(t))) => Some(t.clone()),
            (None, Some(Value::Array(ts))) => {
                let mut alts = Vec::new();
                for t in ts {
                    let t = t
                        .as_str()
                        .ok_or_else(|| SchemaError("type list entries must be strings".into()))?;
                    let e = self.visit_as(schema, &format!("{name}-{t}"), Some(t))?;
                    alts.push(self.add_rule(&format!("{name}-{t}"), e));
                }
                return Ok(format!("({})", alts.join(" | ")));
            }
            (None, None) if obj.contains_key("properties") => Some("object".into()),
            (None, None) if obj.contains_key("items") => Some("array".into()),
            (None, None) => None,
            (None, Some(_)) => return Err(SchemaError("`type` must be a string or a list".into())),
        };
        match ty.as_deref() {
            None => Ok(self.use_primitive("value")),
            Some("string") => self.string_rule(obj),
            Some(t @ ("number" | "integer" | "boolean" | "null")) => Ok(self.use_primitive(t)),
            Some("array") => self.array_rule(obj, name),
            Some("object") => self.object_rule(obj, name),
            Some(t) => Err(SchemaError(format!("unknown type {t:?}"))),
        }
    }

    fn string_rule(&mut self, obj: &serde_json::Map<String, Value>) -> Result<String, SchemaError> {
        let min = obj.get("minLength").and_then(Value::as_u64);
        let max = obj.get("maxLength").and_then(Value::as_u64);
        if min.is_none() && max.is_none() {
            return Ok(self.use_primitive("string"));
        }
        self.use_primitive("char");
        self.use_primitive("space");
        let min = min.unwrap_or(0);
        let rep = match max {
            Some(m) if m < min => return Err(SchemaError("maxLength < minLength".into())),
            Some(m) => format!("{{{min},{m}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(format!("\"\\\"\" char{rep} \"\\\"\" space"))
    }

    fn array_rule(&mut self, obj: &'a serde_json::Map<String, Value>, name: &str) -> Result<String, SchemaError> {
        self.use_primitive("space");
        let item = match obj.get("items") {
            Some(items) => {
                let e = self.visit(items, &format!("{name}-item"))?;
                self.add_rule(&format!("{name}-item"), e)
            }
            None => self.use_primitive("value"),
        };
        let min = obj.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = obj.get("maxItems").and_then(Value::as_u64);
        if let Some(m) = max {
            if m < min {
                return Err(SchemaError("maxItems < minItems".into()));
            }
            if m == 0 {
                return Ok(r#""[" space "]" space"#.into());
            }
        }
        let rest_min = min.saturating_sub(1);
        let rest = match max {
            Some(m) => format!("{{{rest_min},{}}}", m - 1),
            None => format!("{{{rest_min},}}"),
        };
        let seq = format!(r#"{item} ("," space {item}){rest}"#);
        if min == 0 {
            Ok(format!(r#""[" space ({seq})? "]" space"#))
        } else {
            Ok(format!(r#""[" space {seq} "]" space"#))
        }
    }

    fn object_rule(&mut self, obj: &'a serde_json::Map<String, Value>, name: &str) -> Result<String, SchemaError> {
        self.use_primitive("space");
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> = std::sync::OnceLock::new();
        let props: &'a serde_json::Map<String, Value> = match obj.get("properties") {
            Some(Value::Object(p)) => p,
            Some(_) => return Err(SchemaError("`properties` must be an object".into())),
            None => EMPTY.get_or_init(serde_json::Map::new),
        };
        let required: Vec<&str> = match obj.get("required") {
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let additional = obj.get("additionalProperties");
        if props.is_empty() && !matches!(additional, Some(Value::Bool(false))) {
            return Ok(self.use_primitive("object"));
        }
        let mut kv = BTreeMap::new();
        for (k, sub) in props {
            let e = self.visit(sub, &format!("{name}-{k}"))?;
            let v = self.add_rule(&format!("{name}-{k}"), e);
            let body = format!(
                r#"{} space ":" space {v}"#,
                literal(&Value::String(k.clone()).to_string())
            );
            kv.insert(k.clone(), self.add_rule(&format!("{name}-{k}-kv"), body));
        }
        let req: Vec<&String> = props.keys().filter(|k| required.contains(&k.as_str())).collect();
        let opt: Vec<&String> = props.keys().filter(|k| !required.contains(&k.as_str())).collect();
        let mut body = String::from(r#""{" space "#);
        body.push_str(
            &req.iter()
                .map(|k| kv[*k].clone())
                .collect::<Vec<_>>()
                .join(r#" "," space "#),
        );
        if !opt.is_empty() {
            body.push(' ');
            if !req.is_empty() {
                body.push_str(&self.optional_chain(&opt, true, &kv, name));
            } else {
                let alts: Vec<String> = (0..opt.len())
                    .map(|i| self.optional_chain(&opt[i..], false, &kv, name))
                    .collect();
                body.push_str(&format!("({})?", alts.join(" | ")));
            }
        }
        body.push_str(r#" "}" space"#);
        Ok(body)
    }

    /// Upstream's recursive optional-property chain: each later property may
    /// follow, with a comma, in declared order.
    fn optional_chain(
        &mut self,
        ks: &[&String],
        first_is_optional: bool,
        kv: &BTreeMap<String, String>,
        name: &str,
    ) -> String {
        let k = ks[0];
        let mut res = if first_is_optional {
            format!(r#"( "," space {} )?"#, kv[k])
        } else {
            kv[k].clone()
        };
        if ks.len() > 1 {
            let rest = self.optional_chain(&ks[1..], true, kv, name);
            res.push(' ');
            res.push_str(&self.add_rule(&format!("{name}-{k}-rest"), rest));
        }
        res
    }
}

/// GBNF for any JSON object (`response_format: {"type": "json_object"}`).
pub fn json_object_grammar() -> String {
    schema_to_grammar(&serde_json::json!({"type": "object"})).unwrap_or_default()
}

/// Convert a JSON schema into a GBNF grammar whose `root` matches exactly
/// the JSON documents the schema accepts (within the supported subset).
pub fn schema_to_grammar(schema: &Value) -> Result<String, SchemaError> {
    let mut c = Converter {
        root: schema,
        rules: BTreeMap::new(),
        refs_in_progress: Vec::new(),
    };
    let root = c.visit(schema, "root")?;
    c.rules.insert("root".into(), root);
    Ok(c.rules.iter().map(|(k, v)| format!("{k} ::= {v}\n")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_schema_has_required_and_optional_properties() {
        let g = schema_to_grammar(&serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}}},
            "required": ["name"]
        }))
        .unwrap();
        assert!(g.contains("root ::= \"{\" space root-name-kv"), "{g}");
        assert!(g.contains("\"\\\"name\\\"\" space \":\" space"), "{g}");
        assert!(g.contains("integer ::="), "{g}");
        assert!(g.contains("\"\\\"a\\\"\" space"), "{g}");
    }

    #[test]
    fn refs_const_and_type_lists() {
        let g = schema_to_grammar(&serde_json::json!({
            "$defs": {"x": {"type": ["string", "null"]}},
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/x"}, "b": {"const": 3}},
            "required": ["a", "b"]
        }))
        .unwrap();
        assert!(
            g.contains("x ::= (root-a-string | root-a-null)") || g.contains("x ::="),
            "{g}"
        );
        assert!(g.contains("\"3\" space"), "{g}");
        assert!(schema_to_grammar(&serde_json::json!({"$ref": "http://x"})).is_err());
        assert!(schema_to_grammar(&serde_json::json!({"type": "nope"})).is_err());
    }
}
