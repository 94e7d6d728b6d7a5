//! The cases of the HTTP fuzzer: raw HTTP/1.1 requests over every endpoint
//! of llama.cpp's server and the fields it reads, typed and mistyped, at
//! their boundaries, in odd sizes and encodings, with grammars, JSON
//! schemas, images, slot ids, and connections dropped part way.
//!
//! Case `i` of seed `s` is the same bytes on every machine. A case that
//! falls in a [`KnownIssue`] class (inputs that upstream's server is known to
//! crash or hang on, fixed by a later patch) is tagged with it, and the
//! generator makes such inputs only when asked to ([`CaseOptions::known`]):
//! its other cases stay clear of them (ordered repetition bounds, no NUL in
//! grammars, bounded nesting, valid slot ids).

use serde_json::{json, Map, Value};

use crate::fuzz::mutate::Rng;

/// Input classes that upstream's server is known to crash or hang on
/// (issue 17), until the request-hardening patch is in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KnownIssue {
    /// A grammar (or a schema, which becomes one) nested thousands deep:
    /// stack overflow in the parser.
    GrammarDepth,
    /// A NUL character in a grammar literal or range: an uncaught exception.
    GrammarNul,
    /// A token reference `<[N]>` outside the vocabulary: an uncaught exception.
    GrammarTokenRef,
    /// A character range whose end is below its start: an uncaught exception.
    GrammarRange,
    /// A repetition `{m,n}` with m > n (also from a schema's min/max): memory
    /// grows without an answer.
    GrammarMinMax,
    /// `id_slot` at or past the number of slots: never answered.
    IdSlot,
    /// `n_cmpl` (`n`) above half the slots while other clients keep the
    /// slots busy: the task waits for that many free slots at once, and the
    /// others' requests, which need one, take each slot that frees first, so
    /// it may never start (found by this fuzzer).
    NCmplStarvation,
}

impl KnownIssue {
    pub const ALL: [KnownIssue; 7] = [
        KnownIssue::GrammarDepth,
        KnownIssue::GrammarNul,
        KnownIssue::GrammarTokenRef,
        KnownIssue::GrammarRange,
        KnownIssue::GrammarMinMax,
        KnownIssue::IdSlot,
        KnownIssue::NCmplStarvation,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            KnownIssue::GrammarDepth => "grammar-depth",
            KnownIssue::GrammarNul => "grammar-nul",
            KnownIssue::GrammarTokenRef => "grammar-token-ref",
            KnownIssue::GrammarRange => "grammar-range",
            KnownIssue::GrammarMinMax => "grammar-min-max",
            KnownIssue::IdSlot => "id-slot",
            KnownIssue::NCmplStarvation => "n-cmpl-starvation",
        }
    }

    pub fn parse(s: &str) -> Option<KnownIssue> {
        KnownIssue::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// How the client sends a case and reads its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Send it all, read the answer to the end.
    Whole,
    /// Send it all, then close the write side (the body may be shorter than
    /// announced), and read the answer to the end.
    HalfClose,
    /// Send it all, read this many bytes of the answer, then drop the connection.
    DropAfter(usize),
    /// Send this many bytes of the request, then drop the connection.
    DropWhileSending(usize),
}

/// One request.
#[derive(Debug, Clone)]
pub struct Case {
    pub index: u64,
    /// What kind of case it is, e.g. `completion/fields`.
    pub kind: String,
    /// The known issue class it belongs to, if any.
    pub known: Option<KnownIssue>,
    /// The whole request, as sent.
    pub request: Vec<u8>,
    pub action: Action,
    /// The request names something that does not exist (a slot action on a
    /// slot past the last): any 2xx answer is wrong.
    pub must_refuse: bool,
    /// Malformed framing the client keeps the connection open after: it
    /// must be answered or closed within the server's read timeout.
    pub framing: bool,
}

/// What the generator needs to know about the server under test.
#[derive(Debug, Clone)]
pub struct CaseOptions {
    pub seed: u64,
    /// Slots the server runs (`-np`).
    pub n_slots: u32,
    /// Size of the model's vocabulary.
    pub n_vocab: u32,
    /// Known issue classes the generator may produce inputs of.
    pub known: Vec<KnownIssue>,
}

/// A 1x1 PNG.
const PNG_1X1: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4, 0x89, 0x00, 0x00, 0x00, 0x0d, 0x49,
    0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x64, 0x60, 0xf8, 0x5f, 0x0f, 0x00, 0x02, 0x87, 0x01, 0x80, 0xeb, 0x47, 0xba,
    0x92, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// Standard base64 of `data`.
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

const COMPLETION_PATHS: &[&str] = &["/completion", "/completions", "/v1/completions"];
const CHAT_PATHS: &[&str] = &["/chat/completions", "/v1/chat/completions"];
const GET_PATHS: &[&str] = &[
    "/health",
    "/v1/health",
    "/metrics",
    "/props",
    "/models",
    "/v1/models",
    "/slots",
    "/lora-adapters",
    "/v1/stream",
    "/",
    "/index.html",
    "/nonexistent",
];
const OTHER_POST_PATHS: &[&str] = &[
    "/infill",
    "/embedding",
    "/embeddings",
    "/v1/embeddings",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/props",
    "/lora-adapters",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/responses",
    "/chat/completions/input_tokens",
    "/v1/chat/completions/input_tokens",
    "/v1/responses/input_tokens",
    "/v1/chat/completions/control",
    "/v1/streams/lookup",
    "/v1/audio/transcriptions",
    "/v1/systemone",
    "/models/load",
    "/models/unload",
    "/tools",
    "/cors-proxy",
];

/// Case `index` of the run.
pub fn case(opts: &CaseOptions, index: u64) -> Case {
    let mut g = Gen {
        r: Rng::for_case(opts.seed, index),
        opts,
        known: None,
        must_refuse: false,
        framing: false,
    };
    let (kind, request, action) = g.request();
    Case {
        index,
        kind,
        known: g.known,
        request,
        action,
        must_refuse: g.must_refuse,
        framing: g.framing,
    }
}

struct Gen<'a> {
    r: Rng,
    opts: &'a CaseOptions,
    known: Option<KnownIssue>,
    must_refuse: bool,
    framing: bool,
}

impl Gen<'_> {
    fn may(&mut self, k: KnownIssue) -> bool {
        self.opts.known.contains(&k)
    }

    /// Tag the case with `k` (the first tag stays).
    fn tag(&mut self, k: KnownIssue) {
        self.known.get_or_insert(k);
    }

    fn request(&mut self) -> (String, Vec<u8>, Action) {
        let roll = self.r.below(100);
        let (kind, method, path, body) = match roll {
            0..=24 => {
                let path = *self.r.pick(COMPLETION_PATHS);
                let body = self.completion_body(path != "/completion");
                ("completion", "POST", path.to_string(), body)
            }
            25..=46 => {
                let path = *self.r.pick(CHAT_PATHS);
                ("chat", "POST", path.to_string(), self.chat_body())
            }
            47..=58 => {
                let path = *self.r.pick(OTHER_POST_PATHS);
                ("endpoint", "POST", path.to_string(), self.other_body(path))
            }
            59..=63 => ("get", "GET", self.get_path(), Value::Null),
            64..=69 => ("slots", "POST", self.slots_path(), self.slots_body()),
            70..=79 => return self.raw_http(),
            80..=89 => {
                let path = if self.r.one_in(2) {
                    self.r.pick(COMPLETION_PATHS).to_string()
                } else {
                    self.r.pick(CHAT_PATHS).to_string()
                };
                return self.encoding_case(&path);
            }
            _ => return self.disconnect_case(),
        };
        let mut body_bytes = if body.is_null() && method == "GET" {
            Vec::new()
        } else {
            serde_json::to_vec(&body).unwrap_or_default()
        };
        let mut action = Action::Whole;
        // Now and then, a whole-request twist on an otherwise typed case.
        if self.r.one_in(25) && !body_bytes.is_empty() {
            let cut = self.r.below(body_bytes.len());
            body_bytes.truncate(cut);
        }
        if method == "POST" && self.r.one_in(30) {
            action = Action::DropAfter(self.r.below(200));
        }
        let headers = self.headers();
        let req = http_request(method, &path, &headers, &body_bytes, true);
        (format!("{kind}{}", sub(&path)), req, action)
    }

    fn headers(&mut self) -> Vec<(String, String)> {
        let mut h = vec![("Content-Type".to_string(), "application/json".to_string())];
        match self.r.below(20) {
            0 => h[0].1 = "text/plain".into(),
            1 => h[0].1 = "application/json; charset=latin1".into(),
            2 => h.push(("Authorization".into(), "Bearer nonsense".into())),
            3 => h.push(("Accept-Encoding".into(), "gzip, br, zstd".into())),
            4 => h.push(("Origin".into(), "http://evil.example".into())),
            _ => {}
        }
        h
    }

    // ---- values ----

    fn small_text(&mut self) -> String {
        const WORDS: &[&str] = &[
            "Hello",
            "the",
            "capital",
            "of",
            "France",
            "is",
            "1",
            "+",
            "2",
            "=",
            "\n",
            "日本",
            "🙂",
            "<|im_start|>",
            "<|im_end|>",
            "</s>",
            "<s>",
            "[INST]",
            "{{",
            "}}",
            "{%",
            "%}",
            "\\",
            "\"",
            "'",
            "\t",
            "\u{202e}",
            "\u{feff}",
        ];
        let n = 1 + self.r.below(8);
        (0..n).map(|_| *self.r.pick(WORDS)).collect::<Vec<_>>().join(" ")
    }

    fn long_text(&mut self) -> String {
        let n = *self.r.pick(&[1_000usize, 10_000, 100_000, 1_000_000]);
        let unit = self.small_text();
        let mut s = String::with_capacity(n + unit.len());
        while s.len() < n {
            s.push_str(&unit);
        }
        s
    }

    fn text(&mut self) -> Value {
        match self.r.below(12) {
            0 => json!(""),
            1 => json!(self.long_text()),
            2 => json!("\u{0}\u{1}\u{7f}\u{ffff}\u{10ffff}"),
            _ => json!(self.small_text()),
        }
    }

    fn token_id(&mut self) -> Value {
        let v = self.opts.n_vocab as i64;
        match self.r.below(10) {
            0 => json!(-1),
            1 => json!(v),
            2 => json!(v + 1000),
            3 => json!(i32::MAX),
            4 => json!(i64::MAX),
            5 => json!(-(1i64 << 40)),
            6 => json!(1.5),
            _ => json!(self.r.below(v as usize)),
        }
    }

    fn scalar(&mut self) -> Value {
        match self.r.below(22) {
            0 => Value::Null,
            1 => json!(true),
            2 => json!(false),
            3 => json!(0),
            4 => json!(-1),
            5 => json!(1),
            6 => json!(i32::MAX),
            7 => json!(i32::MIN),
            8 => json!(i64::MAX),
            9 => json!(i64::MIN),
            10 => json!(u64::MAX),
            11 => json!(1e308),
            12 => json!(-1e308),
            13 => json!(0.5),
            14 => json!(-0.0),
            15 => json!(1e-320),
            16 => json!(""),
            17 => json!([]),
            18 => json!({}),
            19 => json!([1, "a", null]),
            20 => json!({"a": {"b": [1]}}),
            _ => self.text(),
        }
    }

    /// A number in or near `lo..=hi`, or any scalar now and then.
    fn num(&mut self, lo: f64, hi: f64, int: bool) -> Value {
        match self.r.below(12) {
            0 => self.scalar(),
            1 => num_value(lo, int),
            2 => num_value(hi, int),
            3 => num_value(lo - 1.0, int),
            4 => num_value(hi + 1.0, int),
            5 => num_value(hi * 1000.0 + 1.0, int),
            _ => {
                let f = (self.r.next_u64() % 10_000) as f64 / 10_000.0;
                num_value(lo + (hi - lo) * f, int)
            }
        }
    }

    /// n_predict-like values: mostly small, so that cases stay quick.
    fn n_predict(&mut self) -> Value {
        match self.r.below(16) {
            0 => json!(-1),
            1 => json!(0),
            2 => json!(-2),
            3 => json!(100_000),
            4 => self.scalar(),
            _ => json!(1 + self.r.below(12)),
        }
    }

    fn n_cmpl(&mut self) -> Value {
        let half = (self.opts.n_slots / 2).max(1) as f64;
        if self.may(KnownIssue::NCmplStarvation) && self.r.one_in(3) {
            self.tag(KnownIssue::NCmplStarvation);
            return json!(self.opts.n_slots);
        }
        match self.num(1.0, half, true) {
            // out of the server's range (a clean 400), or within half the slots
            Value::Number(n) if n.as_f64().is_some_and(|x| x > half && x <= self.opts.n_slots as f64) => {
                json!(half as i64)
            }
            v => v,
        }
    }

    fn id_slot(&mut self) -> Value {
        let n = self.opts.n_slots as i64;
        if self.may(KnownIssue::IdSlot) && self.r.one_in(3) {
            self.tag(KnownIssue::IdSlot);
            return json!(*self.r.pick(&[n, n + 1, 1000, i32::MAX as i64]));
        }
        match self.r.below(6) {
            0 => json!(-1),
            1 => json!(-2),
            2 => json!(-(1i64 << 40)),
            _ => json!(self.r.below(n as usize)),
        }
    }

    // ---- grammars and schemas ----

    fn literal(&mut self) -> String {
        const ESC: &[&str] = &[
            "\\n",
            "\\t",
            "\\\"",
            "\\\\",
            "\\x41",
            "\\u00e9",
            "\\U0001F600",
            "a",
            "b",
            "é",
            "🙂",
            " ",
        ];
        let mut s = String::from("\"");
        for _ in 0..1 + self.r.below(4) {
            s.push_str(self.r.pick::<&str>(ESC));
        }
        if self.may(KnownIssue::GrammarNul) && self.r.one_in(6) {
            self.tag(KnownIssue::GrammarNul);
            s.push_str(self.r.pick::<&str>(&["\\u0000", "\\x00", "\\U00000000"]));
        }
        s.push('"');
        s
    }

    fn char_class(&mut self) -> String {
        if self.may(KnownIssue::GrammarRange) && self.r.one_in(6) {
            self.tag(KnownIssue::GrammarRange);
            return self
                .r
                .pick(&["[\\U0010FFFF-\\U00000000]", "[z-a]", "[\\u00ff-\\u0001]"])
                .to_string();
        }
        self.r
            .pick(&[
                "[a-z]",
                "[0-9]",
                "[^\"]",
                "[ \\t\\n]",
                "[a-zA-Z0-9_]",
                "[\\u0100-\\uffff]",
                "[-]",
                "[^a]",
            ])
            .to_string()
    }

    fn repetition(&mut self) -> String {
        if self.may(KnownIssue::GrammarMinMax) && self.r.one_in(5) {
            self.tag(KnownIssue::GrammarMinMax);
            return self.r.pick(&["{5,2}", "{3,0}", "{100,1}"]).to_string();
        }
        match self.r.below(8) {
            0 => "*".into(),
            1 => "+".into(),
            2 => "?".into(),
            3 => format!("{{{}}}", self.r.below(5)),
            4 => format!("{{{},}}", self.r.below(5)),
            5 => {
                let a = self.r.below(4);
                format!("{{{a},{}}}", a + self.r.below(4))
            }
            _ => String::new(),
        }
    }

    fn grammar_expr(&mut self, depth: usize) -> String {
        if depth == 0 {
            return self.literal();
        }
        match self.r.below(8) {
            0 => self.literal(),
            1 => self.char_class(),
            2 => {
                let a = self.grammar_expr(depth - 1);
                let b = self.grammar_expr(depth - 1);
                format!("{a} {b}")
            }
            3 => {
                let a = self.grammar_expr(depth - 1);
                let b = self.grammar_expr(depth - 1);
                format!("({a} | {b})")
            }
            4 => {
                let a = self.grammar_expr(depth - 1);
                let rep = self.repetition();
                format!("({a}){rep}")
            }
            5 => {
                if self.may(KnownIssue::GrammarTokenRef) && self.r.one_in(3) {
                    self.tag(KnownIssue::GrammarTokenRef);
                    return self.r.pick(&["<[999999999]>", "<[-1]>", "<[4294967295]>"]).to_string();
                }
                format!("<[{}]>", self.r.below(self.opts.n_vocab as usize))
            }
            6 => "ws".into(),
            _ => ".".into(),
        }
    }

    fn grammar(&mut self) -> Value {
        if self.may(KnownIssue::GrammarDepth) && self.r.one_in(8) {
            self.tag(KnownIssue::GrammarDepth);
            let n = *self.r.pick(&[5_000usize, 20_000, 100_000]);
            return json!(format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n)));
        }
        match self.r.below(10) {
            0 => json!(""),
            1 => json!("root ::= "),
            2 => {
                // Junk from the grammar's own alphabet (no escapes).
                const A: &[u8] = b"root ::=\"ab|()[]*+?{}0123456789,-^. \n<>#";
                let n = 1 + self.r.below(200);
                let s: String = (0..n).map(|_| *self.r.pick(A) as char).collect();
                json!(if self.r.one_in(2) { format!("root ::= {s}") } else { s })
            }
            3 => json!("root ::= item+\nitem ::= [a-z]+ \" \"\nunused ::= undefined-rule"),
            4 => {
                // Nesting deep enough to matter, well below any stack limit.
                let n = 1 + self.r.below(60);
                json!(format!("root ::= {}\"a\"{}", "(".repeat(n), ")".repeat(n)))
            }
            5 => self.scalar(),
            _ => {
                let depth = 1 + self.r.below(5);
                let e = self.grammar_expr(depth);
                json!(format!("root ::= {e}\nws ::= [ \\t\\n]*"))
            }
        }
    }

    fn schema(&mut self, depth: usize) -> Value {
        if depth == 0 {
            return json!({"type": *self.r.pick(&["string", "integer", "number", "boolean", "null"])});
        }
        let (lo, hi) = {
            let a = self.r.below(5) as i64;
            let b = a + self.r.below(5) as i64;
            if self.may(KnownIssue::GrammarMinMax) && self.r.one_in(6) {
                self.tag(KnownIssue::GrammarMinMax);
                (b + 1, a)
            } else {
                (a, b)
            }
        };
        match self.r.below(12) {
            0 => json!({"type": "object", "properties": {"a": self.schema(depth - 1), "b": self.schema(depth - 1)},
                        "required": ["a"], "additionalProperties": self.r.one_in(2)}),
            1 => json!({"type": "array", "items": self.schema(depth - 1), "minItems": lo, "maxItems": hi}),
            2 => json!({"type": "string", "minLength": lo, "maxLength": hi}),
            3 => json!({"type": "string", "pattern": self.pattern()}),
            4 => json!({"type": "integer", "minimum": lo, "maximum": hi}),
            5 => json!({"type": "number", "minimum": -1.5, "exclusiveMaximum": 1e300}),
            6 => json!({"enum": [1, "a", null, [1], {"x": 1}]}),
            7 => json!({"anyOf": [self.schema(depth - 1), self.schema(depth - 1)]}),
            8 => json!({"$ref": *self.r.pick(&["#/definitions/x", "#", "http://example.com/s.json", "#/$defs/a/b"]),
                        "$defs": {"a": {"type": "string"}}}),
            9 => {
                json!({"type": "string", "format": *self.r.pick(&["date", "date-time", "uuid", "time", "email", "bogus"])})
            }
            10 => json!({"const": self.scalar()}),
            _ => self.scalar(),
        }
    }

    fn pattern(&mut self) -> Value {
        let mut p = String::from("^");
        for _ in 0..1 + self.r.below(5) {
            p.push_str(
                self.r
                    .pick::<&str>(&["[a-z]", "\\d", "(ab|c)", ".", "a", "\\w+", "[^x]", "(", ")", "\\", "|"]),
            );
            if self.may(KnownIssue::GrammarMinMax) && self.r.one_in(8) {
                self.tag(KnownIssue::GrammarMinMax);
                p.push_str("{5,2}");
            } else {
                p.push_str(self.r.pick::<&str>(&["", "*", "+", "?", "{2}", "{1,3}", "{0,}"]));
            }
        }
        if self.r.one_in(2) {
            p.push('$');
        }
        json!(p)
    }

    /// A schema nested `n` deep (known issue when deep).
    fn deep_schema(&mut self) -> Value {
        let n = if self.may(KnownIssue::GrammarDepth) && self.r.one_in(3) {
            self.tag(KnownIssue::GrammarDepth);
            2_000
        } else {
            1 + self.r.below(30)
        };
        let mut s = json!({"type": "string"});
        for _ in 0..n {
            s = json!({"type": "array", "items": s});
        }
        s
    }

    // ---- bodies ----

    /// The sampling and output fields every completion endpoint reads.
    fn sampling_fields(&mut self, m: &mut Map<String, Value>) {
        let n = self.r.below(6);
        for _ in 0..n {
            let (k, v) = match self.r.below(40) {
                0 => ("temperature", self.num(0.0, 2.0, false)),
                1 => ("top_k", self.num(0.0, 100.0, true)),
                2 => ("top_p", self.num(0.0, 1.0, false)),
                3 => ("min_p", self.num(0.0, 1.0, false)),
                4 => ("typical_p", self.num(0.0, 1.0, false)),
                5 => ("repeat_penalty", self.num(0.0, 2.0, false)),
                6 => ("repeat_last_n", self.num(-1.0, 512.0, true)),
                7 => ("presence_penalty", self.num(-2.0, 2.0, false)),
                8 => ("frequency_penalty", self.num(-2.0, 2.0, false)),
                9 => ("mirostat", self.num(0.0, 2.0, true)),
                10 => ("mirostat_tau", self.num(0.0, 10.0, false)),
                11 => ("seed", self.num(-1.0, 4294967295.0, true)),
                12 => ("stop", self.stop()),
                13 => ("n_probs", self.num(0.0, 20.0, true)),
                14 => ("min_keep", self.num(0.0, 100.0, true)),
                15 => ("samplers", self.samplers()),
                16 => ("grammar", self.grammar()),
                17 => ("json_schema", self.schema(3)),
                18 => ("logit_bias", self.logit_bias()),
                19 => ("n_keep", self.num(-1.0, 256.0, true)),
                20 => ("cache_prompt", self.scalar()),
                21 => ("id_slot", self.id_slot()),
                22 => ("ignore_eos", self.scalar()),
                23 => ("dry_multiplier", self.num(0.0, 5.0, false)),
                24 => ("dry_base", self.num(0.0, 5.0, false)),
                25 => ("dry_allowed_length", self.num(0.0, 10.0, true)),
                26 => ("dry_penalty_last_n", self.num(-1.0, 512.0, true)),
                27 => ("dry_sequence_breakers", json!(["\n", "", self.small_text()])),
                28 => ("xtc_probability", self.num(0.0, 1.0, false)),
                29 => ("xtc_threshold", self.num(0.0, 1.0, false)),
                30 => ("dynatemp_range", self.num(0.0, 2.0, false)),
                31 => ("t_max_predict_ms", self.num(0.0, 1000.0, true)),
                32 => ("n_cmpl", self.n_cmpl()),
                33 => ("return_tokens", self.scalar()),
                34 => ("post_sampling_probs", self.scalar()),
                35 => ("timings_per_token", self.scalar()),
                36 => ("lora", json!([{"id": self.token_id(), "scale": self.scalar()}])),
                37 => (
                    "response_fields",
                    json!(["content", "a/b/c", "", "generation_settings/n_ctx"]),
                ),
                38 => ("stream", self.scalar()),
                _ => ("unknown_field_xyz", self.scalar()),
            };
            m.insert(k.into(), v);
        }
    }

    fn stop(&mut self) -> Value {
        match self.r.below(6) {
            0 => json!(""),
            1 => json!([""]),
            2 => json!(vec![self.small_text(); 1 + self.r.below(100)]),
            3 => self.scalar(),
            _ => json!([self.small_text()]),
        }
    }

    fn samplers(&mut self) -> Value {
        match self.r.below(4) {
            0 => json!("kpyxmt"),
            1 => json!(["top_k", "bogus", "temperature", "", "dry", "penalties"]),
            2 => json!(["temperature", "temperature", "temperature"]),
            _ => self.scalar(),
        }
    }

    fn logit_bias(&mut self) -> Value {
        match self.r.below(5) {
            0 => json!([[self.token_id(), self.scalar()]]),
            1 => json!([[self.small_text(), -100.0]]),
            2 => {
                let mut m = Map::new();
                m.insert(format!("{}", self.token_id()), self.scalar());
                m.insert("hello".into(), json!(false));
                Value::Object(m)
            }
            3 => json!([[1, 2, 3], "x", null]),
            _ => self.scalar(),
        }
    }

    fn prompt(&mut self) -> Value {
        match self.r.below(12) {
            0 => json!([self.token_id(), self.token_id()]),
            1 => json!([self.small_text(), self.small_text()]),
            2 => json!([self.small_text(), [self.token_id(), self.small_text()]]),
            3 => json!([]),
            4 => json!({"prompt_string": self.small_text(), "multimodal_data": [base64(PNG_1X1), "!!notbase64"]}),
            5 => self.scalar(),
            6 => self.text(),
            _ => json!(self.small_text()),
        }
    }

    fn completion_body(&mut self, oai: bool) -> Value {
        let mut m = Map::new();
        m.insert("prompt".into(), self.prompt());
        m.insert(if oai { "max_tokens" } else { "n_predict" }.into(), self.n_predict());
        if self.r.one_in(3) {
            m.insert("stream".into(), json!(true));
        }
        if oai && self.r.one_in(4) {
            m.insert("logprobs".into(), self.num(0.0, 20.0, true));
            m.insert("echo".into(), self.scalar());
        }
        self.sampling_fields(&mut m);
        self.shuffle_body(Value::Object(m))
    }

    fn content_part(&mut self) -> Value {
        match self.r.below(10) {
            0 => {
                json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", base64(PNG_1X1))}})
            }
            1 => {
                // A valid header, then garbage.
                let mut png = PNG_1X1[..16].to_vec();
                png.extend((0..self.r.below(5000)).map(|i| (i * 7 % 256) as u8));
                json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", base64(&png))}})
            }
            2 => json!({"type": "image_url", "image_url": {"url": *self.r.pick(&[
                "data:image/png;base64,!!!", "data:,", "data:image/png;base64,", "file:///etc/passwd",
                "file://../../etc/passwd", "/etc/shadow", "", "data:image/jpeg;base64,/9j/4AAQ",
            ])}}),
            3 => json!({"type": "input_audio", "input_audio": {"data": base64(b"RIFF\0\0\0\0WAVE"), "format": "wav"}}),
            4 => json!({"type": "bogus", "text": "x"}),
            5 => json!({"type": "text"}),
            6 => json!({"type": "text", "text": self.scalar()}),
            _ => json!({"type": "text", "text": self.small_text()}),
        }
    }

    fn message(&mut self) -> Value {
        let role = *self.r.pick(&[
            "user",
            "user",
            "user",
            "system",
            "assistant",
            "tool",
            "developer",
            "",
            "bogus",
        ]);
        let content = match self.r.below(8) {
            0 => json!((0..1 + self.r.below(3))
                .map(|_| self.content_part())
                .collect::<Vec<_>>()),
            1 => self.scalar(),
            2 => Value::Null,
            _ => json!(self.small_text()),
        };
        let mut m = json!({"role": role, "content": content});
        if role == "assistant" && self.r.one_in(3) {
            m["tool_calls"] = json!([{"id": "call_1", "type": "function",
                "function": {"name": "f", "arguments": *self.r.pick(&["{}", "{bad json", "\"str\"", ""])}}]);
        }
        if role == "tool" {
            m["tool_call_id"] = json!("call_1");
        }
        if self.r.one_in(10) {
            m["reasoning_content"] = self.text();
        }
        m
    }

    fn tools(&mut self) -> Value {
        match self.r.below(4) {
            0 => json!([{"type": "function", "function": {"name": "get_weather", "description": "w",
                "parameters": self.schema(2)}}]),
            1 => json!([{"type": "function", "function": {"name": "", "parameters": self.deep_schema()}}]),
            2 => json!([{"type": "bogus"}, null, 1]),
            _ => self.scalar(),
        }
    }

    fn chat_body(&mut self) -> Value {
        let n = match self.r.below(10) {
            0 => 0,
            1 => 50 + self.r.below(200),
            _ => 1 + self.r.below(3),
        };
        let mut msgs: Vec<Value> = (0..n).map(|_| self.message()).collect();
        if !msgs.is_empty() && self.r.below(3) > 0 {
            msgs.last_mut().unwrap()["role"] = json!("user");
        }
        let mut m = Map::new();
        m.insert("messages".into(), json!(msgs));
        m.insert(
            (*self.r.pick(&["max_tokens", "max_completion_tokens", "n_predict"])).into(),
            self.n_predict(),
        );
        if self.r.one_in(3) {
            m.insert("stream".into(), json!(true));
            if self.r.one_in(2) {
                m.insert("stream_options".into(), json!({"include_usage": self.scalar()}));
            }
        }
        for _ in 0..self.r.below(3) {
            let (k, v) = match self.r.below(12) {
                0 => ("tools", self.tools()),
                1 => (
                    "tool_choice",
                    json!(*self.r.pick(&["auto", "none", "required", "bogus"])),
                ),
                2 => ("response_format", self.response_format()),
                3 => (
                    "chat_template_kwargs",
                    json!({"enable_thinking": self.scalar(), "x": self.scalar()}),
                ),
                4 => ("logprobs", self.scalar()),
                5 => ("top_logprobs", self.num(0.0, 20.0, true)),
                6 => ("n", self.n_cmpl()),
                7 => ("parallel_tool_calls", self.scalar()),
                8 => (
                    "reasoning_format",
                    json!(*self.r.pick(&["none", "deepseek", "auto", "bogus"])),
                ),
                9 => ("model", self.text()),
                10 => ("chat_template", json!("{{ bogus ")),
                _ => ("add_generation_prompt", self.scalar()),
            };
            m.insert(k.into(), v);
        }
        self.sampling_fields(&mut m);
        self.shuffle_body(Value::Object(m))
    }

    fn response_format(&mut self) -> Value {
        match self.r.below(6) {
            0 => json!({"type": "json_object"}),
            1 => json!({"type": "json_object", "schema": self.schema(3)}),
            2 => json!({"type": "json_schema", "json_schema": {"name": "x", "schema": self.schema(3)}}),
            3 => json!({"type": "json_schema", "json_schema": {"schema": self.deep_schema()}}),
            4 => json!({"type": "bogus"}),
            _ => self.scalar(),
        }
    }

    fn other_body(&mut self, path: &str) -> Value {
        let body = match path {
            "/infill" => json!({"input_prefix": self.text(), "input_suffix": self.text(),
                "input_extra": [{"filename": self.text(), "text": self.text()}, self.scalar()],
                "prompt": self.prompt(), "n_predict": self.n_predict()}),
            "/embedding" | "/embeddings" | "/v1/embeddings" => {
                json!({"input": self.prompt(), "content": self.text(), "encoding_format": *self.r.pick(&["float", "base64", "x"]),
                       "embd_normalize": self.num(-1.0, 2.0, true)})
            }
            "/rerank" | "/reranking" | "/v1/rerank" => json!({"query": self.text(),
                "documents": [self.small_text(), self.scalar()], "top_n": self.num(0.0, 10.0, true)}),
            "/tokenize" => json!({"content": self.text(), "add_special": self.scalar(), "with_pieces": self.scalar(),
                "parse_special": self.scalar()}),
            "/detokenize" => json!({"tokens": (0..self.r.below(20)).map(|_| self.token_id()).collect::<Vec<_>>()}),
            "/apply-template" | "/chat/completions/input_tokens" | "/v1/chat/completions/input_tokens" => {
                return self.chat_body();
            }
            "/lora-adapters" => json!([{"id": self.token_id(), "scale": self.scalar()}]),
            "/props" => json!({"default_generation_settings": {"n_predict": self.scalar()}, "x": self.scalar()}),
            "/v1/messages" | "/v1/messages/count_tokens" => {
                let msgs: Vec<Value> = (0..1 + self.r.below(3)).map(|_| self.message()).collect();
                json!({"model": "x", "max_tokens": self.n_predict(), "messages": msgs,
                       "system": self.text(), "stop_sequences": self.stop(), "stream": self.r.one_in(3),
                       "tools": [{"name": "t", "input_schema": self.schema(2)}], "thinking": {"type": "enabled", "budget_tokens": self.scalar()}})
            }
            "/v1/responses" | "/responses" | "/v1/responses/input_tokens" => json!({"input": self.prompt(),
                "instructions": self.text(), "max_output_tokens": self.n_predict(), "stream": self.r.one_in(3),
                "text": {"format": self.response_format()}}),
            "/v1/streams/lookup" => json!({"id": self.text(), "ids": [self.scalar()], "after": self.scalar()}),
            _ => self.scalar(),
        };
        self.shuffle_body(body)
    }

    fn get_path(&mut self) -> String {
        let base = *self.r.pick(GET_PATHS);
        match self.r.below(6) {
            0 => format!("{base}?fail_on_no_slot={}", self.r.pick(&["1", "0", "x"])),
            1 => format!(
                "{base}?model={}&id={}&after=-1",
                pct(&self.small_text()),
                self.r.below(10)
            ),
            2 => format!("{base}/..%2f..%2fetc%2fpasswd"),
            _ => base.to_string(),
        }
    }

    fn slots_path(&mut self) -> String {
        let n = i64::from(self.opts.n_slots);
        let (id, exists) = match self.r.below(7) {
            0 => ("-1".to_string(), false),
            1 => ("abc".to_string(), false),
            2 => ("99999999999999999999".to_string(), false),
            // past the last slot (upstream took it modulo the slot count)
            3 | 4 => {
                let id = *self
                    .r
                    .pick(&[n, n + 1, 2 * n, 1000, -2, i64::from(i32::MAX), i64::from(i32::MIN)]);
                (id.to_string(), false)
            }
            _ => (format!("{}", self.r.below(self.opts.n_slots as usize)), true),
        };
        let action = *self.r.pick(&["save", "restore", "erase", "bogus", ""]);
        self.must_refuse = !exists;
        format!("/slots/{id}?action={action}")
    }

    fn slots_body(&mut self) -> Value {
        let name = *self.r.pick(&[
            "fuzz.bin",
            "../escape.bin",
            "/tmp/abs.bin",
            "a/b.bin",
            "",
            ".",
            "..",
            "x\u{0}y",
            "nonexistent.bin",
            "%2e%2e%2fx",
        ]);
        json!({"filename": name})
    }

    /// Now and then the whole body is something else entirely.
    fn shuffle_body(&mut self, body: Value) -> Value {
        match self.r.below(40) {
            0 => self.scalar(),
            1 => json!([body]),
            2 => {
                let mut b = body;
                if let Value::Object(m) = &mut b {
                    let keys: Vec<String> = m.keys().cloned().collect();
                    if !keys.is_empty() {
                        let k = self.r.pick(&keys).clone();
                        m.remove(&k);
                    }
                }
                b
            }
            3 => {
                let mut b = body;
                if let Value::Object(m) = &mut b {
                    let keys: Vec<String> = m.keys().cloned().collect();
                    if !keys.is_empty() {
                        let k = self.r.pick(&keys).clone();
                        let v = self.scalar();
                        m.insert(k, v);
                    }
                }
                b
            }
            _ => body,
        }
    }

    // ---- below JSON ----

    fn raw_http(&mut self) -> (String, Vec<u8>, Action) {
        let body = br#"{"prompt":"Hello","n_predict":2}"#;
        if self.r.one_in(4) {
            return self.bad_framing();
        }
        let (name, req, action): (&str, Vec<u8>, Action) = match self.r.below(16) {
            0 => (
                "bad-method",
                b"BREW /completion HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
                Action::Whole,
            ),
            1 => (
                "bad-version",
                b"GET /health HTTP/9.9\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
                Action::Whole,
            ),
            2 => ("http10", b"GET /health HTTP/1.0\r\n\r\n".to_vec(), Action::Whole),
            3 => {
                let p = "/".repeat(1 + self.r.below(100_000));
                (
                    "long-path",
                    format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes(),
                    Action::Whole,
                )
            }
            4 => {
                let v = "a".repeat(*self.r.pick(&[8_000usize, 70_000, 1_000_000]));
                (
                    "huge-header",
                    format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {v}\r\nConnection: close\r\n\r\n").into_bytes(),
                    Action::HalfClose,
                )
            }
            5 => {
                let mut s = String::from("GET /health HTTP/1.1\r\nHost: x\r\n");
                for i in 0..*self.r.pick(&[100usize, 1_000, 10_000]) {
                    s.push_str(&format!("X-{i}: v\r\n"));
                }
                s.push_str("Connection: close\r\n\r\n");
                ("many-headers", s.into_bytes(), Action::HalfClose)
            }
            6 => (
                "short-body",
                http_request_cl("POST", "/completion", body, body.len() + 100),
                Action::HalfClose,
            ),
            7 => (
                "long-body",
                http_request_cl("POST", "/completion", body, body.len().saturating_sub(5)),
                Action::Whole,
            ),
            8 => {
                let cl = *self.r.pick(&["-1", "abc", "99999999999999999999", "1, 2", ""]);
                let mut r = format!(
                    "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {cl}\r\nConnection: close\r\n\r\n"
                )
                .into_bytes();
                r.extend_from_slice(body);
                ("bad-content-length", r, Action::HalfClose)
            }
            9 => {
                let mut r = b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n".to_vec();
                let chunked: &[u8] = match self.r.below(3) {
                    0 => b"10\r\n{\"prompt\":\"Hi\",\r\n10\r\n\"n_predict\":2}   \r\n0\r\n\r\n",
                    1 => b"zz\r\nbad\r\n0\r\n\r\n",
                    _ => b"ffffffffffffffff\r\n{}\r\n",
                };
                r.extend_from_slice(chunked);
                ("chunked", r, Action::HalfClose)
            }
            10 => {
                let mut r = b"POST /completion HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Type: application/json\r\nConnection: close\r\n".to_vec();
                r.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
                r.extend_from_slice(body);
                ("expect-continue", r, Action::Whole)
            }
            11 => {
                let b = b"--B\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nHello\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFFxxxx\r\n--B--\r\n";
                let path = *self
                    .r
                    .pick(&["/v1/audio/transcriptions", "/completion", "/v1/chat/completions"]);
                let mut r = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", b.len()).into_bytes();
                r.extend_from_slice(b);
                ("multipart", r, Action::Whole)
            }
            12 => {
                let n = 1 + self.r.below(4096);
                let junk: Vec<u8> = (0..n).map(|_| self.r.next_u64() as u8).collect();
                ("random-bytes", junk, Action::HalfClose)
            }
            13 => (
                "header-injection",
                b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\rb\nc\r\n\r\n".to_vec(),
                Action::HalfClose,
            ),
            14 => {
                // Two requests pipelined on one connection.
                let mut r = http_request("POST", "/tokenize", &[], br#"{"content":"a"}"#, false);
                r.extend(http_request("GET", "/health", &[], b"", true));
                ("pipelined", r, Action::Whole)
            }
            _ => ("empty", Vec::new(), Action::HalfClose),
        };
        (format!("raw/{name}"), req, action)
    }

    /// Framing no HTTP/1.1 server accepts, on a connection the client keeps
    /// open (as a client waiting for its answer would).
    fn bad_framing(&mut self) -> (String, Vec<u8>, Action) {
        self.framing = true;
        let body = br#"{"prompt":"Hello","n_predict":2}"#;
        let (name, req): (&str, Vec<u8>) = match self.r.below(5) {
            // a TLS 1.2/1.3 ClientHello's first bytes, on the plain port
            0 => {
                let mut r = vec![0x16, 0x03, 0x01, 0x00, 0xc4, 0x01, 0x00, 0x00, 0xc0, 0x03, 0x03];
                r.extend((0..32).map(|_| self.r.next_u64() as u8));
                r.extend_from_slice(&[0x00, 0x00, 0x04, 0x13, 0x01, 0x13, 0x02, 0x01, 0x00]);
                ("tls-client-hello", r)
            }
            1 => ("bare-lf", b"GET /health HTTP/1.1\nHost: x\n\n".to_vec()),
            2 => (
                "bare-lf-headers",
                b"GET /health HTTP/1.1\r\nHost: x\nAccept: */*\n\n".to_vec(),
            ),
            3 => {
                let mut r = b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n".to_vec();
                r.extend_from_slice(format!("{:x}\n", body.len()).as_bytes());
                r.extend_from_slice(body);
                r.extend_from_slice(b"\n0\n\n");
                ("chunked-bare-lf", r)
            }
            _ => {
                let n = 1 + self.r.below(64);
                let junk: Vec<u8> = (0..n).map(|_| self.r.next_u64() as u8 | 0x80).collect();
                ("binary-no-newline", junk)
            }
        };
        (format!("raw/{name}"), req, Action::Whole)
    }

    fn encoding_case(&mut self, path: &str) -> (String, Vec<u8>, Action) {
        let (name, body): (&str, Vec<u8>) = match self.r.below(12) {
            0 => (
                "invalid-utf8",
                b"{\"prompt\":\"a\xff\xfe\xc0\xaf b\",\"n_predict\":2}".to_vec(),
            ),
            1 => (
                "lone-surrogate",
                br#"{"prompt":"\ud800\udfff\udc00","n_predict":2,"messages":[{"role":"user","content":"\ud83d"}]}"#
                    .to_vec(),
            ),
            2 => (
                "nul-escape",
                br#"{"prompt":"a\u0000b","n_predict":2,"messages":[{"role":"user","content":"\u0000"}]}"#.to_vec(),
            ),
            3 => ("bom", b"\xef\xbb\xbf{\"prompt\":\"a\",\"n_predict\":2}".to_vec()),
            4 => {
                let n = *self.r.pick(&[100usize, 10_000, 100_000, 1_000_000]);
                let mut b = b"{\"prompt\":".to_vec();
                b.extend(std::iter::repeat(b'[').take(n));
                b.extend(std::iter::repeat(b']').take(n));
                b.push(b'}');
                ("deep-json", b)
            }
            5 => (
                "huge-number",
                br#"{"prompt":"a","n_predict":1e999999,"temperature":-1e999,"seed":123456789012345678901234567890}"#
                    .to_vec(),
            ),
            6 => (
                "nan",
                br#"{"prompt":"a","n_predict":NaN,"temperature":Infinity}"#.to_vec(),
            ),
            7 => (
                "duplicate-keys",
                br#"{"prompt":"a","prompt":[1,2],"n_predict":2,"n_predict":"x"}"#.to_vec(),
            ),
            8 => ("trailing", br#"{"prompt":"a","n_predict":2} {"x":1}"#.to_vec()),
            9 => ("comments", b"{/* c */\"prompt\":\"a\", // c\n\"n_predict\":2}".to_vec()),
            10 => {
                let n = *self.r.pick(&[1_000usize, 100_000]);
                let mut b = b"{\"prompt\":\"a\",\"n_predict\":2".to_vec();
                for i in 0..n {
                    b.extend(format!(",\"k{i}\":{i}").as_bytes());
                }
                b.push(b'}');
                ("many-keys", b)
            }
            _ => (
                "truncated",
                br#"{"prompt":"a","n_predict":2,"messages":[{"role":"us"#.to_vec(),
            ),
        };
        let req = http_request(
            "POST",
            path,
            &[("Content-Type".into(), "application/json".into())],
            &body,
            true,
        );
        (format!("encoding/{name}"), req, Action::Whole)
    }

    fn disconnect_case(&mut self) -> (String, Vec<u8>, Action) {
        let stream = self.r.below(3) > 0;
        let (path, body) = if self.r.one_in(2) {
            (
                "/completion",
                json!({"prompt": self.small_text(), "n_predict": 1 + self.r.below(48), "stream": stream}),
            )
        } else {
            (
                "/v1/chat/completions",
                json!({"messages": [{"role": "user", "content": self.small_text()}],
                "max_tokens": 1 + self.r.below(48), "stream": stream}),
            )
        };
        let bytes = serde_json::to_vec(&body).unwrap();
        let req = http_request(
            "POST",
            path,
            &[("Content-Type".into(), "application/json".into())],
            &bytes,
            true,
        );
        let (name, action) = match self.r.below(4) {
            0 => ("while-sending", Action::DropWhileSending(self.r.below(req.len()))),
            1 => ("before-answer", Action::DropAfter(0)),
            _ => ("mid-answer", Action::DropAfter(1 + self.r.below(2000))),
        };
        (format!("disconnect/{name}"), req, action)
    }
}

fn num_value(x: f64, int: bool) -> Value {
    if int {
        json!(x.round() as i64)
    } else {
        json!(x)
    }
}

/// The endpoint part of a case's kind: `/v1/chat/completions` → `/chat/completions`.
fn sub(path: &str) -> String {
    let p = path.split('?').next().unwrap_or(path);
    let p = p.strip_prefix("/v1").unwrap_or(p);
    if p.starts_with("/slots/") {
        "/slots/:id".into()
    } else {
        p.to_string()
    }
}

fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A request with a correct Content-Length (for a body or a POST).
pub fn http_request(method: &str, path: &str, headers: &[(String, String)], body: &[u8], close: bool) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").into_bytes();
    for (k, v) in headers {
        r.extend(format!("{k}: {v}\r\n").as_bytes());
    }
    if method != "GET" || !body.is_empty() {
        r.extend(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    if close {
        r.extend(b"Connection: close\r\n");
    }
    r.extend(b"\r\n");
    r.extend_from_slice(body);
    r
}

fn http_request_cl(method: &str, path: &str, body: &[u8], content_length: usize) -> Vec<u8> {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(known: Vec<KnownIssue>) -> CaseOptions {
        CaseOptions {
            seed: 7,
            n_slots: 4,
            n_vocab: 49152,
            known,
        }
    }

    #[test]
    fn cases_are_deterministic() {
        let o = opts(vec![]);
        for i in 0..200 {
            let (a, b) = (case(&o, i), case(&o, i));
            assert_eq!(a.request, b.request);
            assert_eq!(a.kind, b.kind);
        }
    }

    #[test]
    fn known_issues_only_when_asked() {
        let none = opts(vec![]);
        for i in 0..3000 {
            let c = case(&none, i);
            assert_eq!(c.known, None, "case {i} ({}) is tagged", c.kind);
            let text = String::from_utf8_lossy(&c.request);
            for bad in ["{5,2}", "<[999999999]>", "\\\\u0000", "\\\\U0010FFFF-"] {
                assert!(!text.contains(bad), "case {i} contains {bad}");
            }
        }
        let all = opts(KnownIssue::ALL.to_vec());
        let tagged = (0..3000).filter(|&i| case(&all, i).known.is_some()).count();
        assert!(tagged > 30, "only {tagged} known-issue cases in 3000");
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
