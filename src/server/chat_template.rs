//! Chat templates: llama.cpp's built-in templates (`llama_chat_apply_template`)
//! or the GGUF's Jinja `tokenizer.chat_template` rendered with minijinja,
//! with Hugging Face semantics (`messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, `raise_exception`, `strftime_now`, `tojson`,
//! Python string and dict methods, `trim_blocks`/`lstrip_blocks`).

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde_json::Value as Json;

use crate::engine::{self, ChatMessage, Model};

/// A chat template could not be selected or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the model has no chat template; pass --chat-template")]
    Missing,
    #[error("the chat template does not parse: {0}")]
    Parse(String),
    #[error("the chat template failed: {0}")]
    Render(String),
}

/// How chats are turned into prompts.
pub enum ChatTemplate {
    /// llama.cpp's built-in implementation of a known template.
    Builtin { source: String },
    /// A Jinja template.
    Jinja {
        env: Box<Environment<'static>>,
        source: String,
        bos: String,
        eos: String,
    },
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChatTemplate::Builtin { .. } => f.write_str("ChatTemplate::Builtin"),
            ChatTemplate::Jinja { .. } => f.write_str("ChatTemplate::Jinja"),
        }
    }
}

fn builtin_recognises(template: &str) -> bool {
    let probe = [ChatMessage {
        role: "user".into(),
        content: "hi".into(),
    }];
    engine::apply_chat_template(template, &probe, true).is_ok()
}

fn looks_like_jinja(s: &str) -> bool {
    s.contains("{%") || s.contains("{{")
}

impl ChatTemplate {
    /// Pick the template for a model: `override_` (a built-in name or Jinja
    /// source) or the GGUF's own; Jinja when `jinja` is `Some(true)` or the
    /// template is not one llama.cpp knows.
    pub fn select(model: &Model, override_: Option<&str>, jinja: Option<bool>) -> Result<ChatTemplate, TemplateError> {
        let source = match override_ {
            Some(s) => s.to_string(),
            None => model.chat_template(None).ok_or(TemplateError::Missing)?,
        };
        let builtin_ok = builtin_recognises(&source);
        let use_jinja = match jinja {
            Some(true) => looks_like_jinja(&source),
            Some(false) => false,
            None => !builtin_ok,
        };
        if !use_jinja {
            if !builtin_ok {
                return Err(TemplateError::Parse(
                    "llama.cpp's built-in templates do not recognise it (drop --no-jinja)".into(),
                ));
            }
            return Ok(ChatTemplate::Builtin { source });
        }
        let piece = |t: Option<i32>| {
            t.and_then(|t| model.token_to_bytes(t, true).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        Self::jinja(
            source,
            piece(model.token_bos()).unwrap_or_default(),
            piece(model.token_eos()).unwrap_or_default(),
        )
    }

    /// A Jinja template with the given special-token strings.
    pub fn jinja(source: String, bos: String, eos: String) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(python_methods);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> Result<Value, Error> {
            Ok(Value::from(strftime_now(&fmt)))
        });
        env.add_template_owned("chat", source.clone())
            .map_err(|e| TemplateError::Parse(e.to_string()))?;
        Ok(ChatTemplate::Jinja {
            env: Box::new(env),
            source,
            bos,
            eos,
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        match self {
            ChatTemplate::Builtin { source } | ChatTemplate::Jinja { source, .. } => source,
        }
    }

    /// Whether this is rendered with Jinja.
    pub fn is_jinja(&self) -> bool {
        matches!(self, ChatTemplate::Jinja { .. })
    }

    /// Render messages (OpenAI JSON, content already flattened to strings
    /// for the built-in path) into a prompt. `extra` adds template variables
    /// (`tools`, `--chat-template-kwargs`, ...).
    pub fn render(
        &self,
        messages: &[Json],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Json>,
    ) -> Result<String, TemplateError> {
        match self {
            ChatTemplate::Builtin { source } => {
                let msgs: Vec<ChatMessage> = messages
                    .iter()
                    .map(|m| ChatMessage {
                        role: m.get("role").and_then(Json::as_str).unwrap_or("user").to_string(),
                        content: m.get("content").map(content_text).unwrap_or_default(),
                    })
                    .collect();
                engine::apply_chat_template(source, &msgs, add_generation_prompt)
                    .map_err(|e| TemplateError::Render(e.to_string()))
            }
            ChatTemplate::Jinja { env, bos, eos, .. } => {
                let mut ctx = extra.clone();
                ctx.insert("messages".into(), Json::Array(messages.to_vec()));
                ctx.insert("add_generation_prompt".into(), Json::Bool(add_generation_prompt));
                ctx.insert("bos_token".into(), Json::String(bos.clone()));
                ctx.insert("eos_token".into(), Json::String(eos.clone()));
                let tmpl = env
                    .get_template("chat")
                    .map_err(|e| TemplateError::Render(e.to_string()))?;
                tmpl.render(Json::Object(ctx))
                    .map_err(|e| TemplateError::Render(render_error(&e)))
            }
        }
    }
}

fn render_error(e: &Error) -> String {
    match e.detail() {
        Some(d) if e.kind() == ErrorKind::InvalidOperation => d.to_string(),
        _ => e.to_string(),
    }
}

/// The text of an OpenAI message `content`: a string, or the `text` parts
/// of an array joined by newlines.
pub fn content_text(content: &Json) -> String {
    match content {
        Json::String(s) => s.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|p| {
                if let Json::String(s) = p {
                    Some(s.as_str())
                } else {
                    p.get("text").and_then(Json::as_str)
                }
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Json::Null => String::new(),
        other => other.to_string(),
    }
}

fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1).clamp(0, 11) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

fn arg_str(args: &[Value], i: usize) -> Option<String> {
    args.get(i).and_then(|v| v.as_str().map(String::from))
}

/// Python methods that Hugging Face templates call on strings, dicts and lists.
fn python_methods(_: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let unknown = || {
        Error::new(
            ErrorKind::UnknownMethod,
            format!("{} has no method {method}", value.kind()),
        )
    };
    match value.kind() {
        ValueKind::String => {
            let s = value.as_str().unwrap_or_default();
            let chars: Option<Vec<char>> = arg_str(args, 0).map(|c| c.chars().collect());
            let strip_set = |c: char| chars.as_ref().map_or(c.is_whitespace(), |set| set.contains(&c));
            Ok(match method {
                "strip" => Value::from(s.trim_matches(strip_set)),
                "lstrip" => Value::from(s.trim_start_matches(strip_set)),
                "rstrip" => Value::from(s.trim_end_matches(strip_set)),
                "upper" => Value::from(s.to_uppercase()),
                "lower" => Value::from(s.to_lowercase()),
                "capitalize" => {
                    let mut c = s.chars();
                    Value::from(c.next().map_or(String::new(), |f| {
                        f.to_uppercase().chain(c.flat_map(char::to_lowercase)).collect()
                    }))
                }
                "title" => Value::from(
                    s.split(' ')
                        .map(|w| {
                            let mut c = w.chars();
                            c.next().map_or(String::new(), |f| {
                                f.to_uppercase().chain(c.flat_map(char::to_lowercase)).collect()
                            })
                        })
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
                "startswith" | "endswith" => {
                    let test = |p: &str| {
                        if method == "startswith" {
                            s.starts_with(p)
                        } else {
                            s.ends_with(p)
                        }
                    };
                    match args.first() {
                        Some(v) if v.kind() == ValueKind::Seq => {
                            Value::from(v.try_iter()?.any(|p| p.as_str().is_some_and(test)))
                        }
                        Some(v) => Value::from(v.as_str().is_some_and(test)),
                        None => return Err(unknown()),
                    }
                }
                "split" | "rsplit" => {
                    let parts: Vec<Value> = match arg_str(args, 0) {
                        Some(sep) if !sep.is_empty() => {
                            let max = args.get(1).and_then(|v| i64::try_from(v.clone()).ok()).unwrap_or(-1);
                            if max < 0 {
                                s.split(sep.as_str()).map(Value::from).collect()
                            } else if method == "split" {
                                s.splitn(max as usize + 1, sep.as_str()).map(Value::from).collect()
                            } else {
                                let mut v: Vec<Value> =
                                    s.rsplitn(max as usize + 1, sep.as_str()).map(Value::from).collect();
                                v.reverse();
                                v
                            }
                        }
                        _ => s.split_whitespace().map(Value::from).collect(),
                    };
                    Value::from(parts)
                }
                "replace" => match (arg_str(args, 0), arg_str(args, 1)) {
                    (Some(a), Some(b)) => Value::from(s.replace(&a, &b)),
                    _ => return Err(unknown()),
                },
                "find" => Value::from(arg_str(args, 0).and_then(|p| s.find(&p)).map_or(-1, |i| i as i64)),
                "count" => Value::from(arg_str(args, 0).map_or(0, |p| s.matches(&p).count())),
                "isdigit" => Value::from(!s.is_empty() && s.chars().all(|c| c.is_ascii_digit())),
                "join" => {
                    let items: Vec<String> = args.first().map_or(Ok(Vec::new()), |v| {
                        v.try_iter().map(|it| it.map(|x| x.to_string()).collect())
                    })?;
                    Value::from(items.join(s))
                }
                _ => return Err(unknown()),
            })
        }
        ValueKind::Map => match method {
            "items" => {
                let mut out = Vec::new();
                for k in value.try_iter()? {
                    let v = value.get_item(&k)?;
                    out.push(Value::from(vec![k, v]));
                }
                Ok(Value::from(out))
            }
            "keys" => Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            "values" => {
                let mut out = Vec::new();
                for k in value.try_iter()? {
                    out.push(value.get_item(&k)?);
                }
                Ok(Value::from(out))
            }
            "get" => {
                let key = args.first().cloned().unwrap_or_default();
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    v
                })
            }
            _ => Err(unknown()),
        },
        ValueKind::Seq => match method {
            "count" => {
                let needle = args.first().cloned().unwrap_or_default();
                Ok(Value::from(value.try_iter()?.filter(|v| *v == needle).count()))
            }
            "index" => {
                let needle = args.first().cloned().unwrap_or_default();
                value
                    .try_iter()?
                    .position(|v| v == needle)
                    .map(Value::from)
                    .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "value not in list"))
            }
            _ => Err(unknown()),
        },
        _ => Err(unknown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<Json> {
        vec![
            serde_json::json!({"role": "system", "content": "  Be brief.  "}),
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
        ]
    }

    #[test]
    fn jinja_renders_hf_style_templates() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[S]{{ m['content'].strip() }}\n{% else %}[{{ m.role|upper }}]{{ m.content if m.content is string else m.content[0].text }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}[A]{% endif %}";
        let t = ChatTemplate::jinja(src.into(), "<s>".into(), "</s>".into()).unwrap();
        let out = t.render(&msgs(), true, &Default::default()).unwrap();
        assert_eq!(out, "<s>[S]Be brief.\n[USER]Hi\n[A]");
    }

    #[test]
    fn raise_exception_reports_its_message() {
        let t = ChatTemplate::jinja(
            "{{ raise_exception('no system role') }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        let e = t.render(&msgs(), true, &Default::default()).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }

    #[test]
    fn python_methods_and_strftime() {
        let t = ChatTemplate::jinja(
            "{{ 'a,b,c'.split(',')|length }}{{ 'xAy'.lower() }}{{ {'k': 1}.items()|list|length }}{{ strftime_now('%Y')|length }}{{ 'ab'.startswith(('x', 'a')) }}".into(),
            String::new(),
            String::new(),
        )
        .unwrap();
        assert_eq!(t.render(&[], false, &Default::default()).unwrap(), "3xay14True");
    }
}
