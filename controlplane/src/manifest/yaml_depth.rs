//! How deep the collections of a YAML text nest, and how many documents it holds, found in
//! one linear pass before any YAML parser sees the text.
//!
//! libyaml (under serde_yaml_ng) tokenises the whole of a document before serde's recursion
//! limit applies, and its tokeniser costs O(flow depth) a token: a 100,000-deep `[[[...]]]`
//! took gpuctl over 20 s of CPU. This pass follows libyaml's scanner (`scanner.rs` of
//! unsafe-libyaml 0.2.11, the libyaml 0.2.5 port serde_yaml_ng runs) in what decides where
//! tokens start and end (comments, quoted, plain and block scalars, anchors, tags, document
//! markers, simple keys and their 1,024-byte and one-line window) and in what opens a
//! collection: a flow `[` or `{`, a block sequence or mapping (libyaml's indentation stack),
//! an indentless sequence under a mapping key, and a single-pair mapping in a flow sequence
//! (`[a: b]`). It counts what the parser would nest, never less: where libyaml decides only
//! later that a node was a key (`[[x]]: y`), the levels seen inside the key count one more.
//! Where libyaml would stop on an error the pass may stop too, for nothing after an error is
//! parsed. Every token costs O(1) plus O(open levels), and the pass ends at the first level
//! past the bound, so the whole costs O(bytes × bound).

/// Why a text is refused: too deep at `line` (1-based) of `document` (1-based), or too
/// many documents (the first one too many starts at `line`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooDeep { document: usize, line: usize },
    TooManyDocuments { line: usize },
}

/// Checks that no collection of `text` nests deeper than `max_depth` and that it holds at
/// most `max_documents` documents.
pub fn check(text: &str, max_depth: usize, max_documents: usize) -> Result<(), Refusal> {
    let mut scan = Scanner::new(text.as_bytes(), max_depth, max_documents);
    scan.run();
    match scan.refused {
        Some(r) => Err(r),
        None => Ok(()),
    }
}

/// The deepest nesting the pass counts in `text` (for tests: a bound it never stops at).
#[cfg(test)]
pub fn deepest(text: &str) -> usize {
    let mut scan = Scanner::new(text.as_bytes(), usize::MAX, usize::MAX);
    scan.run();
    scan.deepest
}

/// A possible simple key (libyaml's `yaml_simple_key_t`): where it starts, and the deepest
/// level seen since (its content's, should it turn out to be a key).
#[derive(Clone, Copy, Debug, Default)]
struct Key {
    possible: bool,
    line: usize,
    index: usize,
    column: usize,
    deepest: usize,
}

/// A block collection on libyaml's indentation stack.
#[derive(Clone, Copy, Debug)]
struct Block {
    column: isize,
    map: bool,
    /// A sequence at the same column below one of this mapping's keys (`key:\n- a`): the
    /// parser's indentless sequence, one level more. Kept until the mapping ends (counting
    /// at most one level too many).
    indentless: bool,
}

#[derive(Clone, Copy, Debug)]
struct Flow {
    seq: bool,
    /// A `?` or `:` in this sequence's current entry: the parser's single-pair mapping.
    pair: bool,
}

struct Scanner<'a> {
    s: &'a [u8],
    pos: usize,
    /// libyaml's mark: line and column (in characters); its index is `pos` (in bytes).
    line: usize,
    column: usize,
    blocks: Vec<Block>,
    flows: Vec<Flow>,
    /// `keys[0]` is the block context's possible simple key, `keys[i]` that of `flows[i-1]`.
    keys: Vec<Key>,
    key_allowed: bool,
    depth: usize,
    deepest: usize,
    documents: usize,
    in_document: bool,
    max_depth: usize,
    max_documents: usize,
    refused: Option<Refusal>,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl<'a> Scanner<'a> {
    fn new(s: &'a [u8], max_depth: usize, max_documents: usize) -> Self {
        Scanner {
            s,
            pos: 0,
            line: 0,
            column: 0,
            blocks: Vec::new(),
            flows: Vec::new(),
            keys: vec![Key::default()],
            key_allowed: true,
            depth: 0,
            deepest: 0,
            documents: 0,
            in_document: false,
            max_depth,
            max_documents,
            refused: None,
        }
    }

    fn byte(&self, off: usize) -> u8 {
        self.s.get(self.pos + off).copied().unwrap_or(0)
    }

    /// End of input (libyaml's reader refuses a NUL, so the scanner never passes one).
    fn at_end(&self) -> bool {
        self.byte(0) == 0
    }

    /// The length of the line break at `off`, 0 if there is none: CR LF, CR, LF, NEL, LS, PS.
    fn break_len(&self, off: usize) -> usize {
        match (self.byte(off), self.byte(off + 1), self.byte(off + 2)) {
            (b'\r', b'\n', _) => 2,
            (b'\r' | b'\n', _, _) => 1,
            (0xC2, 0x85, _) => 2,
            (0xE2, 0x80, 0xA8 | 0xA9) => 3,
            _ => 0,
        }
    }

    fn is_break(&self, off: usize) -> bool {
        self.break_len(off) > 0
    }

    fn is_breakz(&self, off: usize) -> bool {
        self.is_break(off) || self.byte(off) == 0
    }

    fn is_blank(&self, off: usize) -> bool {
        matches!(self.byte(off), b' ' | b'\t')
    }

    fn is_blankz(&self, off: usize) -> bool {
        self.is_blank(off) || self.is_breakz(off)
    }

    /// `---` or `...` at the start of a line, followed by a blank or the end of the line.
    fn at_document_marker(&self) -> Option<u8> {
        let c = self.byte(0);
        (self.column == 0 && matches!(c, b'-' | b'.') && self.byte(1) == c && self.byte(2) == c && self.is_blankz(3)).then_some(c)
    }

    /// Moves past one character (not a line break).
    fn advance(&mut self) {
        let width = match self.byte(0) {
            0 => return,
            b if b < 0x80 => 1,
            b if b >= 0xF0 => 4,
            b if b >= 0xE0 => 3,
            _ => 2,
        };
        self.pos = (self.pos + width).min(self.s.len());
        self.column += 1;
    }

    /// Moves past one line break.
    fn skip_break(&mut self) {
        self.pos += self.break_len(0);
        self.line += 1;
        self.column = 0;
    }

    fn indent(&self) -> isize {
        self.blocks.last().map_or(-1, |b| b.column)
    }

    /// Notes that the parser is `depth` levels deep here.
    fn observe(&mut self, depth: usize) {
        for k in self.keys.iter_mut().filter(|k| k.possible) {
            k.deepest = k.deepest.max(depth);
        }
        if depth > self.deepest {
            self.deepest = depth;
            if depth > self.max_depth && self.refused.is_none() {
                self.refused = Some(Refusal::TooDeep { document: self.documents.max(1), line: self.line + 1 });
            }
        }
    }

    fn run(&mut self) {
        while self.refused.is_none() && self.next_token() {}
    }

    /// libyaml's `yaml_parser_fetch_next_token`; false at the end of the input or where
    /// libyaml stops on an error.
    fn next_token(&mut self) -> bool {
        self.skip_to_next_token();
        self.stale_keys();
        self.unroll(self.column as isize);
        if self.at_end() {
            return false;
        }
        let c = self.byte(0);
        if self.column == 0 && c == b'%' {
            // A directive: the rest of its line.
            self.unroll(-1);
            self.remove_key();
            self.key_allowed = false;
            while !self.is_breakz(0) {
                self.advance();
            }
            return true;
        }
        if let Some(marker) = self.at_document_marker() {
            self.unroll(-1);
            self.remove_key();
            self.key_allowed = false;
            if marker == b'-' {
                self.start_document();
            } else {
                self.in_document = false;
            }
            for _ in 0..3 {
                self.advance();
            }
            return true;
        }
        if !self.in_document {
            self.start_document();
        }
        let in_flow = !self.flows.is_empty();
        match c {
            b'[' | b'{' => {
                self.save_key();
                self.flows.push(Flow { seq: c == b'[', pair: false });
                self.keys.push(Key::default());
                self.depth += 1;
                self.observe(self.depth);
                self.key_allowed = true;
                self.advance();
            }
            b']' | b'}' => {
                self.remove_key();
                if let Some(f) = self.flows.pop() {
                    self.keys.pop();
                    self.depth -= 1 + usize::from(f.pair);
                }
                self.key_allowed = false;
                self.advance();
            }
            b',' => {
                self.remove_key();
                self.key_allowed = true;
                if let Some(f) = self.flows.last_mut().filter(|f| f.pair) {
                    f.pair = false;
                    self.depth -= 1;
                }
                self.advance();
            }
            b'-' if self.is_blankz(1) => {
                if !in_flow && !self.roll(self.column as isize, false) {
                    self.indentless();
                }
                self.remove_key();
                self.key_allowed = true;
                self.advance();
            }
            b'?' if in_flow || self.is_blankz(1) => {
                if in_flow {
                    self.pair();
                } else {
                    self.roll(self.column as isize, true);
                }
                self.remove_key();
                self.key_allowed = !in_flow;
                self.advance();
            }
            b':' if in_flow || self.is_blankz(1) => {
                self.value();
                self.advance();
            }
            b'*' | b'&' => {
                self.save_key();
                self.key_allowed = false;
                self.advance();
                while matches!(self.byte(0), b'0'..=b'9' | b'A'..=b'Z' | b'a'..=b'z' | b'_' | b'-') {
                    self.advance();
                }
            }
            b'!' => {
                self.save_key();
                self.key_allowed = false;
                self.tag();
            }
            b'|' | b'>' if !in_flow => {
                self.remove_key();
                self.key_allowed = true;
                return self.block_scalar();
            }
            b'\'' | b'"' => {
                self.save_key();
                self.key_allowed = false;
                return self.quoted(c == b'\'');
            }
            _ if self.plain_starts() => {
                self.save_key();
                self.key_allowed = false;
                return self.plain();
            }
            // libyaml: "found character that cannot start any token".
            _ => return false,
        }
        true
    }

    fn start_document(&mut self) {
        self.documents += 1;
        self.in_document = true;
        if self.documents > self.max_documents && self.refused.is_none() {
            self.refused = Some(Refusal::TooManyDocuments { line: self.line + 1 });
        }
    }

    /// libyaml's `yaml_parser_scan_to_next_token`: spaces, tabs where they are not
    /// indentation, a BOM at the start of a line (serde_yaml_ng sets the encoding, so even
    /// the text's first BOM is left to this; it counts as a column), comments and line breaks.
    fn skip_to_next_token(&mut self) {
        loop {
            if self.column == 0 && self.s[self.pos..].starts_with(BOM) {
                self.advance();
            }
            while self.byte(0) == b' ' || ((!self.flows.is_empty() || !self.key_allowed) && self.byte(0) == b'\t') {
                self.advance();
            }
            if self.byte(0) == b'#' {
                while !self.is_breakz(0) {
                    self.advance();
                }
            }
            if !self.is_break(0) {
                return;
            }
            self.skip_break();
            if self.flows.is_empty() {
                self.key_allowed = true;
            }
        }
    }

    /// A simple key that did not end on its line, or within 1,024 bytes, is none.
    fn stale_keys(&mut self) {
        let (line, index) = (self.line, self.pos);
        for k in self.keys.iter_mut().filter(|k| k.possible) {
            if k.line < line || k.index + 1024 < index {
                k.possible = false;
            }
        }
    }

    fn save_key(&mut self) {
        if self.key_allowed {
            let key = Key { possible: true, line: self.line, index: self.pos, column: self.column, deepest: self.depth };
            *self.keys.last_mut().expect("a key per level") = key;
        }
    }

    fn remove_key(&mut self) {
        self.keys.last_mut().expect("a key per level").possible = false;
    }

    /// A block collection at `column` if it is deeper than the current one (in the block
    /// context only); whether one was opened.
    fn roll(&mut self, column: isize, map: bool) -> bool {
        if !self.flows.is_empty() || self.indent() >= column {
            return false;
        }
        self.blocks.push(Block { column, map, indentless: false });
        self.depth += 1;
        self.observe(self.depth);
        true
    }

    fn unroll(&mut self, column: isize) {
        if !self.flows.is_empty() {
            return;
        }
        while self.indent() > column {
            let b = self.blocks.pop().expect("indent() > -1");
            self.depth -= 1 + usize::from(b.indentless);
        }
    }

    /// A `-` at the column of the current block collection: when that is a mapping, the
    /// parser opens an indentless sequence.
    fn indentless(&mut self) {
        if let Some(b) = self.blocks.last_mut().filter(|b| b.map && !b.indentless) {
            b.indentless = true;
            self.depth += 1;
            self.observe(self.depth);
        }
    }

    /// A `?` or `:` in a flow sequence: the parser's single-pair mapping.
    fn pair(&mut self) {
        if let Some(f) = self.flows.last_mut().filter(|f| f.seq && !f.pair) {
            f.pair = true;
            self.depth += 1;
            self.observe(self.depth);
        }
    }

    /// libyaml's `yaml_parser_fetch_value`.
    fn value(&mut self) {
        let level = self.flows.len();
        let key = self.keys[level];
        if key.possible {
            // What was scanned since the key was saved is a key after all: one level deeper.
            if level == 0 {
                if self.roll(key.column as isize, true) {
                    self.observe(key.deepest + 1);
                }
            } else if self.flows[level - 1].seq {
                self.observe(key.deepest + 1);
                self.pair();
            }
            self.keys[level].possible = false;
            self.key_allowed = false;
        } else {
            if level == 0 {
                self.roll(self.column as isize, true);
            } else {
                self.pair();
            }
            self.key_allowed = level == 0;
        }
    }

    /// libyaml's test for a plain scalar's first character.
    fn plain_starts(&self) -> bool {
        let c = self.byte(0);
        let indicator = self.is_blankz(0) || b"-?:,[]{}#&*!|>'\"%@`".contains(&c);
        !indicator || (c == b'-' && !self.is_blank(1)) || (self.flows.is_empty() && matches!(c, b'?' | b':') && !self.is_blankz(1))
    }

    /// libyaml's `yaml_parser_scan_tag`: `!<uri>`, or a handle and suffix up to a blank
    /// (or a `,` in a flow collection). Anything else after it is an error there.
    fn tag(&mut self) {
        if self.byte(1) == b'<' {
            self.advance();
            self.advance();
            while !self.is_blankz(0) && self.byte(0) != b'>' {
                self.advance();
            }
            if self.byte(0) == b'>' {
                self.advance();
            }
        } else {
            self.advance();
            while !self.is_blankz(0) && (self.flows.is_empty() || self.byte(0) != b',') {
                self.advance();
            }
        }
    }

    /// libyaml's `yaml_parser_scan_flow_scalar`; false where it fails.
    fn quoted(&mut self, single: bool) -> bool {
        let quote = if single { b'\'' } else { b'"' };
        self.advance();
        loop {
            if self.at_document_marker().is_some() || self.at_end() {
                return false;
            }
            while !self.is_blankz(0) {
                let c = self.byte(0);
                if single && c == b'\'' && self.byte(1) == b'\'' {
                    self.advance();
                    self.advance();
                } else if c == quote {
                    break;
                } else if !single && c == b'\\' && self.is_break(1) {
                    self.advance();
                    self.skip_break();
                    break;
                } else if !single && c == b'\\' {
                    // An escape: the backslash and the character after it (the hex digits
                    // of \x, \u and \U are ordinary characters here).
                    self.advance();
                    if self.at_end() {
                        return false;
                    }
                    self.advance();
                } else {
                    self.advance();
                }
            }
            if self.byte(0) == quote {
                self.advance();
                return true;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    self.advance();
                } else {
                    self.skip_break();
                }
            }
        }
    }

    /// libyaml's `yaml_parser_scan_plain_scalar`: in the block context it goes on over line
    /// breaks while the next line is indented past the current block collection.
    fn plain(&mut self) -> bool {
        let indent = self.indent() + 1;
        let in_flow = !self.flows.is_empty();
        let mut leading_blanks = false;
        loop {
            if self.at_document_marker().is_some() || self.byte(0) == b'#' {
                break;
            }
            while !self.is_blankz(0) {
                let c = self.byte(0);
                if in_flow && c == b':' && matches!(self.byte(1), b',' | b'?' | b'[' | b']' | b'{' | b'}') {
                    return false; // "found unexpected ':'"
                }
                if (c == b':' && self.is_blankz(1)) || (in_flow && matches!(c, b',' | b'[' | b']' | b'{' | b'}')) {
                    break;
                }
                self.advance();
                leading_blanks = false;
            }
            if !(self.is_blank(0) || self.is_break(0)) {
                break;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    if leading_blanks && (self.column as isize) < indent && self.byte(0) == b'\t' {
                        return false; // "found a tab character that violates indentation"
                    }
                    self.advance();
                } else {
                    self.skip_break();
                    leading_blanks = true;
                }
            }
            if !in_flow && (self.column as isize) < indent {
                break;
            }
        }
        if leading_blanks {
            self.key_allowed = true;
        }
        true
    }

    /// libyaml's `yaml_parser_scan_block_scalar`: its header, then the lines indented at
    /// least as far as its first (or as its indentation indicator says).
    fn block_scalar(&mut self) -> bool {
        self.advance();
        let mut increment = 0;
        let digit = |b: u8| b.is_ascii_digit().then(|| isize::from(b - b'0'));
        if matches!(self.byte(0), b'+' | b'-') {
            self.advance();
            if let Some(d) = digit(self.byte(0)) {
                if d == 0 {
                    return false;
                }
                increment = d;
                self.advance();
            }
        } else if let Some(d) = digit(self.byte(0)) {
            if d == 0 {
                return false;
            }
            increment = d;
            self.advance();
            if matches!(self.byte(0), b'+' | b'-') {
                self.advance();
            }
        }
        while self.is_blank(0) {
            self.advance();
        }
        if self.byte(0) == b'#' {
            while !self.is_breakz(0) {
                self.advance();
            }
        }
        if !self.is_breakz(0) {
            return false;
        }
        if self.is_break(0) {
            self.skip_break();
        }
        let mut indent = match increment {
            0 => 0,
            d if self.indent() >= 0 => self.indent() + d,
            d => d,
        };
        if !self.block_breaks(&mut indent) {
            return false;
        }
        while self.column as isize == indent && !self.at_end() {
            while !self.is_breakz(0) {
                self.advance();
            }
            if self.is_break(0) {
                self.skip_break();
            }
            if !self.block_breaks(&mut indent) {
                return false;
            }
        }
        true
    }

    /// libyaml's `yaml_parser_scan_block_scalar_breaks`: empty lines and indentation, and
    /// the scalar's indentation when no indicator gave it.
    fn block_breaks(&mut self, indent: &mut isize) -> bool {
        let mut max_indent = 0;
        loop {
            while (*indent == 0 || (self.column as isize) < *indent) && self.byte(0) == b' ' {
                self.advance();
            }
            max_indent = max_indent.max(self.column as isize);
            if (*indent == 0 || (self.column as isize) < *indent) && self.byte(0) == b'\t' {
                return false;
            }
            if !self.is_break(0) {
                break;
            }
            self.skip_break();
        }
        if *indent == 0 {
            *indent = max_indent.max(self.indent() + 1).max(1);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// How deep serde_yaml_ng's value nests (what the parser built).
    fn value_depth(v: &serde_yaml_ng::Value) -> usize {
        use serde_yaml_ng::Value;
        match v {
            Value::Sequence(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
            Value::Mapping(m) => 1 + m.iter().map(|(k, v)| value_depth(k).max(value_depth(v))).max().unwrap_or(0),
            Value::Tagged(t) => value_depth(&t.value),
            _ => 0,
        }
    }

    /// The parser's depth of every document, or None if it refuses the text.
    fn parsed_depth(text: &str) -> Option<usize> {
        use serde::Deserialize;
        let mut deepest = 0;
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            deepest = deepest.max(value_depth(&serde_yaml_ng::Value::deserialize(doc).ok()?));
        }
        Some(deepest)
    }

    #[test]
    fn counts_what_the_parser_nests() {
        let cases = [
            ("a: 1", 1),
            ("[1, [2, [3]]]", 3),
            ("{a: {b: {c: d}}}", 3),
            ("- - - x", 3),
            ("a:\n  b:\n    c: 1\n", 3),
            ("a:\n- x\n- y\nb: 1\n", 2),
            ("- a: 1\n  b: [x, {y: z}]\n", 4),
            ("[a: b]", 2),
            ("[[x]: y]", 3),
            ("[[x]]: y", 3),
            ("? - a\n: b\n", 2),
            ("--- [x]\n--- [[y]]\n", 2),
            // serde_yaml_ng sets the encoding, so libyaml skips only a BOM at a line's start,
            // as a column: a second one starts a plain scalar (found by the property below).
            ("\u{feff}\u{feff}#: ", 1),
            ("\u{feff}[[x]]", 2),
        ];
        for (text, depth) in cases {
            assert_eq!(parsed_depth(text), Some(depth), "the parser on {text:?}");
            assert_eq!(deepest(text), depth, "{text:?}");
        }
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_count() {
        let text = "a: 'x[[[[' # [[[[\nb: \"[[[[\\\" [[\"\nc: |\n  [[[[[[\n  {{{{\nd: x[[[[ y\ne: >-\n  [[[[\n  ]]]]\nf: plain\n  continued [[[[\n";
        assert_eq!(parsed_depth(text), Some(1));
        assert_eq!(deepest(text), 1);
    }

    #[test]
    fn deep_texts_are_refused_at_the_line_past_the_bound() {
        let flow = format!("kind: x\n---\nspec: {}\n", "[".repeat(100));
        assert_eq!(check(&flow, 64, 10), Err(Refusal::TooDeep { document: 2, line: 3 }));
        let block: String = (0..70).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
        assert_eq!(check(&block, 64, 10), Err(Refusal::TooDeep { document: 1, line: 65 }));
        assert_eq!(check(&"- ".repeat(65), 64, 10), Err(Refusal::TooDeep { document: 1, line: 1 }));
        assert_eq!(check(&"- ".repeat(64), 64, 10), Ok(()));
        assert_eq!(check(&"---\n".repeat(11), 64, 10), Err(Refusal::TooManyDocuments { line: 11 }));
        assert_eq!(check(&"---\n".repeat(10), 64, 10), Ok(()));
    }

    #[test]
    fn a_hundred_thousand_levels_cost_linear_time() {
        // Each was 20-24 s of CPU in libyaml. Here each is one pass that stops at level 65.
        let n = 100_000;
        let texts = ["[".repeat(n), "{a: ".repeat(n), "- ".repeat(n), "[a: ".repeat(n), format!("{}x{}", "[".repeat(n), "]".repeat(n))];
        for text in &texts {
            // Refused by the pass itself, at the first line: libyaml never sees it (its cost
            // is measured, not asserted here: speed belongs in benchmarks).
            assert!(matches!(check(text, 64, 10), Err(Refusal::TooDeep { document: 1, line: 1 })));
        }
    }

    /// Texts made of YAML's structural characters, words and line breaks; no aliases (the
    /// parser's value repeats what an alias names, deeper than the text nests).
    fn yamlish() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "[",
            "]",
            "{",
            "}",
            ",",
            ": ",
            ":",
            "? ",
            "- ",
            "-",
            "#",
            " #c",
            "'",
            "\"",
            "\\",
            "|",
            ">",
            "&a ",
            "!t ",
            "!!str ",
            "!<x,[]> ",
            "a",
            "b",
            "x y",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            "\r",
            "\u{85}",
            "\u{2028}",
            "\n  ",
            "\n    ",
            "\n- ",
            "\n? ",
            "\n: ",
            "\n---\n",
            "\n...\n",
            "\n%YAML 1.1\n---\n",
            "''",
            "\\\"",
            "|2\n",
            ">-\n",
            "|+ #c\n",
            "\u{feff}",
            "é",
        ]);
        prop::collection::vec(piece, 0..60).prop_map(|p| p.concat())
    }

    /// A tree of YAML nodes, written out below in styles drawn from a seed.
    #[derive(Clone, Debug)]
    enum Node {
        Scalar(u8),
        Seq(Vec<Node>),
        Map(Vec<(Node, Node)>),
    }

    fn tree() -> impl Strategy<Value = Node> {
        any::<u8>().prop_map(Node::Scalar).prop_recursive(8, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Node::Seq),
                prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Node::Map),
            ]
        })
    }

    /// Writes a [`Node`] as YAML: block and flow collections, indentless sequences,
    /// collections as keys, `?` keys, single pairs in flow sequences, quoted, plain,
    /// multi-line and block scalars with brackets inside, comments, anchors and tags.
    struct Writer {
        seed: u64,
        anchors: usize,
    }

    impl Writer {
        fn pick(&mut self, n: u64) -> u64 {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.seed % n
        }

        fn props(&mut self) -> String {
            match self.pick(8) {
                0 => {
                    self.anchors += 1;
                    format!("&a{} ", self.anchors)
                }
                1 => "!t ".into(),
                _ => String::new(),
            }
        }

        fn scalar(&mut self, b: u8, in_flow: bool) -> String {
            let word = ["x", "y", "a b", "x[y", "1.5", "k#z", "u]v"][usize::from(b) % 7];
            let word = if in_flow { word.replace(['[', ']'], "") } else { word.to_string() };
            match self.pick(5) {
                0 => format!("'{word} [[ '' {{'"),
                1 => format!("\"{word} [[ \\\" {{\""),
                _ => word,
            }
        }

        fn flow(&mut self, node: &Node) -> String {
            let props = self.props();
            let body = match node {
                Node::Scalar(b) => self.scalar(*b, true),
                Node::Seq(items) => {
                    let items: Vec<String> = items
                        .iter()
                        .map(|i| match (i, self.pick(4)) {
                            // A single pair in a flow sequence.
                            (Node::Map(pairs), 0) if pairs.len() == 1 => format!("{}: {}", self.flow(&pairs[0].0), self.flow(&pairs[0].1)),
                            _ => self.flow(i),
                        })
                        .collect();
                    format!("[{}]", items.join(", "))
                }
                Node::Map(pairs) => {
                    let pairs: Vec<String> = pairs
                        .iter()
                        .map(|(k, v)| match self.pick(5) {
                            0 => format!("? {} : {}", self.flow(k), self.flow(v)),
                            _ => format!("{}: {}", self.flow(k), self.flow(v)),
                        })
                        .collect();
                    format!("{{{}}}", pairs.join(", "))
                }
            };
            format!("{props}{body}")
        }

        fn comment(&mut self) -> &'static str {
            if self.pick(4) == 0 {
                " # [[{{"
            } else {
                ""
            }
        }

        /// `node` as the value after `- ` or `key:` at `indent`, from the end of that line.
        fn block_value(&mut self, node: &Node, indent: usize, under_key: bool) -> String {
            let pad = " ".repeat(indent + 2);
            match node {
                Node::Scalar(b) => match self.pick(6) {
                    0 => format!(" |{}\n{pad}[[[ {{{{\n{pad}  ]]\n", self.comment()),
                    1 => format!(" >-\n{pad}[[\n\n{pad}x\n"),
                    2 if !matches!(b % 7, 5) => format!(" {}\n{pad}more [[ words\n", self.scalar(*b, false).replace(['\'', '"'], "")),
                    _ => format!(" {}{}\n", self.scalar(*b, false), self.comment()),
                },
                Node::Seq(items) if !items.is_empty() && self.pick(2) == 0 => {
                    // Indentless under a key, else indented.
                    let at = if under_key && self.pick(2) == 0 { indent } else { indent + 2 };
                    format!("{}\n{}", self.comment(), self.block(node, at))
                }
                Node::Map(pairs) if !pairs.is_empty() && self.pick(2) == 0 => {
                    format!("{}\n{}", self.comment(), self.block(node, indent + 2))
                }
                _ => format!(" {}{}\n", self.flow(node), self.comment()),
            }
        }

        /// A block collection at `indent` (whole lines).
        fn block(&mut self, node: &Node, indent: usize) -> String {
            let pad = " ".repeat(indent);
            match node {
                Node::Seq(items) => items.iter().map(|i| format!("{pad}-{}", self.block_value(i, indent, false))).collect(),
                Node::Map(pairs) => pairs
                    .iter()
                    .map(|(k, v)| match (k, self.pick(4)) {
                        (Node::Scalar(b), 0 | 1) => {
                            format!("{pad}{}:{}", self.scalar(*b, false).replace(['#', '"', '\''], ""), self.block_value(v, indent, true))
                        }
                        (_, 2) => format!("{pad}?{}{pad}:{}", self.block_value(k, indent, false), self.block_value(v, indent, false)),
                        _ => format!("{pad}{}:{}", self.flow(k), self.block_value(v, indent, true)),
                    })
                    .collect(),
                Node::Scalar(_) => format!("{pad}{}\n", self.flow(node)),
            }
        }
    }

    fn node_depth(n: &Node) -> usize {
        match n {
            Node::Scalar(_) => 0,
            Node::Seq(items) => 1 + items.iter().map(node_depth).max().unwrap_or(0),
            Node::Map(pairs) => 1 + pairs.iter().map(|(k, v)| node_depth(k).max(node_depth(v))).max().unwrap_or(0),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2048)))]

        /// Never less than the parser nests, whatever the text.
        #[test]
        fn never_counts_less_than_the_parser(text in yamlish()) {
            if let Some(depth) = parsed_depth(&text) {
                prop_assert!(deepest(&text) >= depth, "{text:?}: the parser nests {depth}, the pass counts {}", deepest(&text));
            }
        }

        /// The same on YAML written from trees in every style; what the parser reads is
        /// counted no less, and a text the writer got wrong is skipped.
        #[test]
        fn never_counts_less_than_the_parser_on_written_yaml(node in tree(), seed in 1..u64::MAX, block in any::<bool>()) {
            let mut writer = Writer { seed, anchors: 0 };
            let text = if block { writer.block(&node, 0) } else { writer.flow(&node) };
            if let Some(depth) = parsed_depth(&text) {
                prop_assert!(deepest(&text) >= depth, "{text}\nthe parser nests {depth}, the pass counts {}", deepest(&text));
                prop_assert!(deepest(&text) <= 2 * node_depth(&node) + 1, "{text}\ncounted {} for a tree {} deep", deepest(&text), node_depth(&node));
            }
        }
    }
}
