//! Argo CD's pattern matching (`util/glob`), the one matcher for every name and namespace pattern
//! upstream argocd-agent matches with it (on the principal, the agent and in their flag checks): `--allowed-namespaces` on principal and agent, AppProject
//! destination names (`!` denials included) and `agentName=` server globs, `sourceNamespaces`.
//!
//! Owns the syntax and its edge cases, as `github.com/gobwas/glob` v0.2.3 compiles a pattern with
//! no separators (how Argo CD's `glob.Match` calls it):
//! - `*` (and `**`) any run of characters, `/` and `.` included; `?` exactly one character;
//! - `[abc]` one of the listed characters, `[a-z]` one in the range (one range, not a list of
//!   ranges: `[a-z0-9]` is invalid), `[!...]` the negation (`[^...]` is a list holding `^`);
//! - `{a,b*,c?}` alternatives, each a pattern, nested allowed (an unclosed `{` ends at the end of
//!   the pattern, as gobwas parses it); `,` and `}` outside braces and `]` outside brackets are
//!   literal;
//! - `\` escapes the next character (a trailing `\` is dropped);
//! - characters are Unicode scalar values; the whole text must match.
//!
//! An invalid pattern (`[`, `[]`, `[a-z0-9]`, `[z-a]`) matches nothing and is logged, as Argo CD's
//! `glob.Match` does; flags refuse it at startup with [`Glob::new`]'s error. Lists ([`match_in_list`])
//! add Argo CD's `MatchStringInList(.., REGEXP)`: an entry `/re/` is an unanchored regular
//! expression (Rust's `regex`, which lacks the look-around of Argo CD's regexp2: such an entry fails
//! to compile and matches nothing, logged), every other entry a glob.
//!
//! No crate has these semantics: `globset` rejects `**` not adjacent to `/`, lists of ranges and
//! nested braces that gobwas accepts and accepts `[a-z0-9]` that gobwas refuses; `wildmatch` has no
//! brackets or braces. Patterns compile to a small NFA matched in one pass (time linear in text
//! length times pattern size, whatever the pattern: AppProject authors write some of them).

use std::fmt;

/// A pattern that does not compile, with gobwas's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobError {
    /// The pattern.
    pub pattern: String,
    /// Why it is invalid.
    pub reason: &'static str,
}

impl fmt::Display for GlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid glob {:?}: {}", self.pattern, self.reason)
    }
}

impl std::error::Error for GlobError {}

/// One step of the compiled pattern.
#[derive(Debug, Clone)]
enum Inst {
    /// One character from a class.
    Char(Class),
    /// Continue at both (epsilon).
    Split(usize, usize),
    /// Continue at (epsilon).
    Jump(usize),
    /// The whole text matched if the input ends here.
    Match,
}

/// The characters one step accepts.
#[derive(Debug, Clone)]
enum Class {
    Literal(char),
    Any,
    List { chars: Vec<char>, not: bool },
    Range { lo: char, hi: char, not: bool },
}

impl Class {
    fn accepts(&self, c: char) -> bool {
        match self {
            Self::Literal(l) => *l == c,
            Self::Any => true,
            Self::List { chars, not } => chars.contains(&c) != *not,
            Self::Range { lo, hi, not } => (*lo <= c && c <= *hi) != *not,
        }
    }
}

/// The parse tree (gobwas's AST).
#[derive(Debug)]
enum Node {
    Class(Class),
    Star,
    AnyOf(Vec<Vec<Node>>),
}

/// A compiled pattern.
#[derive(Debug, Clone)]
pub struct Glob {
    program: Vec<Inst>,
}

/// The lexer and parser, in one pass over the characters (gobwas's lexer rules).
struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    pattern: &'a str,
}

impl Parser<'_> {
    fn error(&self, reason: &'static str) -> GlobError {
        GlobError {
            pattern: self.pattern.to_owned(),
            reason,
        }
    }

    /// A sequence up to the end, or (inside braces, `depth > 0`) up to `,` or `}`, which it
    /// leaves unread.
    fn sequence(&mut self, depth: usize) -> Result<Vec<Node>, GlobError> {
        let mut out = Vec::new();
        while let Some(&c) = self.chars.peek() {
            match c {
                ',' | '}' if depth > 0 => break,
                '*' => {
                    self.chars.next();
                    if self.chars.peek() == Some(&'*') {
                        self.chars.next();
                    }
                    out.push(Node::Star);
                }
                '?' => {
                    self.chars.next();
                    out.push(Node::Class(Class::Any));
                }
                '[' => {
                    self.chars.next();
                    out.push(Node::Class(self.range()?));
                }
                '{' => {
                    self.chars.next();
                    out.push(Node::AnyOf(self.alternatives(depth + 1)?));
                }
                _ => {
                    let breakers: &[char] = if depth > 0 {
                        &['?', '*', '[', '{', '}', ',']
                    } else {
                        &['?', '*', '[', '{']
                    };
                    for l in self.text(breakers) {
                        out.push(Node::Class(Class::Literal(l)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// After `{`: alternatives up to the matching `}` (or the end of the pattern).
    fn alternatives(&mut self, depth: usize) -> Result<Vec<Vec<Node>>, GlobError> {
        let mut alts = vec![self.sequence(depth)?];
        loop {
            match self.chars.next() {
                Some(',') => alts.push(self.sequence(depth)?),
                // `}`, or the end: gobwas closes open braces at the end without complaint.
                _ => return Ok(alts),
            }
        }
    }

    /// Literal text up to a breaker (left unread), `\` escaping the next character.
    fn text(&mut self, breakers: &[char]) -> Vec<char> {
        let mut out = Vec::new();
        let mut escaped = false;
        while let Some(&c) = self.chars.peek() {
            if !escaped && breakers.contains(&c) {
                break;
            }
            self.chars.next();
            if !escaped && c == '\\' {
                escaped = true;
                continue;
            }
            escaped = false;
            out.push(c);
        }
        out
    }

    /// After `[`: `[!]` then either `lo-hi` or a list of characters, then `]`.
    fn range(&mut self) -> Result<Class, GlobError> {
        let mut not = false;
        if self.chars.peek() == Some(&'!') {
            self.chars.next();
            not = true;
        }
        let eof = |p: &Self| p.error("unexpected end of input");
        let Some(&first) = self.chars.peek() else {
            return Err(eof(self));
        };
        let mut ahead = self.chars.clone();
        ahead.next();
        let class = if ahead.peek() == Some(&'-') {
            self.chars.next();
            self.chars.next();
            let hi = self.chars.next().ok_or_else(|| eof(self))?;
            if first == '\0' || hi == '\0' {
                return Err(self.error("could not parse range"));
            }
            if hi < first {
                return Err(self.error("hi character should be greater than lo"));
            }
            Class::Range { lo: first, hi, not }
        } else {
            let chars = self.text(&[']']);
            if chars.is_empty() {
                // `[]` and `[!]`: neither a range nor a list.
                return match self.chars.peek() {
                    None => Err(eof(self)),
                    Some(_) => Err(self.error("could not parse range")),
                };
            }
            Class::List { chars, not }
        };
        match self.chars.next() {
            Some(']') => Ok(class),
            Some(_) => Err(self.error("expected close range character")),
            None => Err(eof(self)),
        }
    }
}

/// Appends `nodes` to `program` (Thompson's construction).
fn compile(nodes: &[Node], program: &mut Vec<Inst>) {
    for node in nodes {
        match node {
            Node::Class(c) => program.push(Inst::Char(c.clone())),
            Node::Star => {
                // L: split(L+1, L+3); L+1: any; L+2: jump L; L+3: ...
                let at = program.len();
                program.push(Inst::Split(at + 1, at + 3));
                program.push(Inst::Char(Class::Any));
                program.push(Inst::Jump(at));
            }
            Node::AnyOf(alts) => {
                // A chain of splits, one per alternative, each alternative jumping to the end.
                let mut jumps = Vec::new();
                for (i, alt) in alts.iter().enumerate() {
                    let split = (i + 1 < alts.len()).then(|| {
                        program.push(Inst::Split(program.len() + 1, usize::MAX));
                        program.len() - 1
                    });
                    compile(alt, program);
                    jumps.push(program.len());
                    program.push(Inst::Jump(usize::MAX));
                    if let Some(s) = split {
                        let next = program.len();
                        if let Inst::Split(_, b) = &mut program[s] {
                            *b = next;
                        }
                    }
                }
                let end = program.len();
                for j in jumps {
                    program[j] = Inst::Jump(end);
                }
            }
        }
    }
}

impl Glob {
    /// Compiles `pattern`, or says why gobwas would refuse it.
    pub fn new(pattern: &str) -> Result<Self, GlobError> {
        let mut parser = Parser {
            chars: pattern.chars().peekable(),
            pattern,
        };
        // At depth 0 the sequence reads the whole pattern (`,` and `}` are text there).
        let nodes = parser.sequence(0)?;
        let mut program = Vec::new();
        compile(&nodes, &mut program);
        program.push(Inst::Match);
        Ok(Self { program })
    }

    /// Whether the whole of `text` matches.
    pub fn matches(&self, text: &str) -> bool {
        let n = self.program.len();
        let mut current = vec![false; n];
        let mut next = vec![false; n];
        self.add(&mut current, 0);
        for c in text.chars() {
            next.iter_mut().for_each(|s| *s = false);
            let mut any = false;
            for (pc, on) in current.iter().enumerate() {
                if let (true, Inst::Char(class)) = (*on, &self.program[pc]) {
                    if class.accepts(c) {
                        self.add(&mut next, pc + 1);
                        any = true;
                    }
                }
            }
            if !any {
                return false;
            }
            std::mem::swap(&mut current, &mut next);
        }
        current
            .iter()
            .zip(&self.program)
            .any(|(on, inst)| *on && matches!(inst, Inst::Match))
    }

    /// Marks `pc` and every state reachable from it without reading a character.
    fn add(&self, set: &mut [bool], pc: usize) {
        let mut stack = vec![pc];
        while let Some(pc) = stack.pop() {
            if set[pc] {
                continue;
            }
            set[pc] = true;
            match self.program[pc] {
                Inst::Split(a, b) => stack.extend([b, a]),
                Inst::Jump(a) => stack.push(a),
                Inst::Char(_) | Inst::Match => {}
            }
        }
    }
}

/// Argo CD's `glob.Match`: whether `text` matches `pattern`; an invalid pattern matches nothing
/// and is logged.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    match Glob::new(pattern) {
        Ok(g) => g.matches(text),
        Err(e) => {
            tracing::warn!("failed to compile pattern {pattern}: {e}");
            false
        }
    }
}

/// Argo CD's `glob.MatchStringInList(list, item, REGEXP)`: whether an entry matches `item`, an
/// entry `/re/` as an unanchored regular expression, any other as a glob.
pub fn match_in_list(list: &[String], item: &str) -> bool {
    list.iter().any(|entry| {
        let regex = entry
            .strip_prefix('/')
            .and_then(|e| e.strip_suffix('/'))
            .and_then(|re| match regex::Regex::new(re) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("failed to compile pattern {re}: {e}");
                    None
                }
            });
        regex.is_some_and(|r| r.is_match(item)) || glob_match(entry, item)
    })
}

/// For flags: every entry of a pattern list compiles (a glob, or a `/re/` regular expression).
pub fn validate_list(list: &[String]) -> Result<(), String> {
    for entry in list {
        if let Some(re) = entry.strip_prefix('/').and_then(|e| e.strip_suffix('/')) {
            if let Err(e) = regex::Regex::new(re) {
                return Err(format!("invalid regular expression {entry:?}: {e}"));
            }
        } else {
            Glob::new(entry).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (pattern, text, matches); a pattern that does not compile matches nothing.
    const CASES: &[(&str, &str, bool)] = &[
        // Argo CD's util/glob Test_Match.
        ("hello", "hello", true),
        ("hell", "hello", false),
        ("hell*", "hello", true),
        ("h*", "hello", true),
        ("e*", "hello", false),
        ("e[[a*", "e[[a*", false),
        // gobwas/glob's glob_test.go (no separators).
        ("* ?at * eyes", "my cat has very bright eyes", true),
        ("", "", true),
        ("", "b", false),
        ("*ä", "åä", true),
        ("abc", "abc", true),
        ("a*c", "abc", true),
        ("a*c", "a12345c", true),
        ("a?c", "a1c", true),
        ("a.b", "a.b", true),
        ("a.*", "a.b", true),
        ("a.**", "a.b.c", true),
        ("a.?.c", "a.b.c", true),
        ("a.?.?", "a.b.c", true),
        ("?at", "cat", true),
        ("?at", "fat", true),
        ("*", "abc", true),
        (r"\*", "*", true),
        ("**", "a.b.c", true),
        ("?at", "at", false),
        ("?at", "fat", true),
        ("a.*", "a.b.c", true),
        ("{a,b}", "a", true),
        ("{a,b}", "b", true),
        ("{a,b}", "c", false),
        ("a{b,c}d", "acd", true),
        ("{ab,c*}x", "cqqx", true),
        ("{a,{b,c}}", "c", true),
        ("{a,}b", "b", true),
        ("[abc]", "b", true),
        ("[abc]", "d", false),
        ("[!abc]", "d", true),
        ("[!abc]", "a", false),
        ("[a-c]", "b", true),
        ("[a-c]", "d", false),
        ("[!a-c]", "d", true),
        ("[!a-c]", "b", false),
        ("[^a]", "^", true),
        ("[^a]", "b", false),
        ("a[\\]]b", "a]b", true),
        ("a]b", "a]b", true),
        ("a}b,c", "a}b,c", true),
        ("agent-*", "agent-1", true),
        ("agent-?", "agent-12", false),
        ("*/*", "a/b", true),
        ("{a,b", "b", true),
        ("a\\", "a", true),
        ("[!!]", "a", true),
        ("{}", "", true),
        ("x{a,b}}", "xa}", true),
        // Invalid: nothing matches.
        ("[]a]", "a", false),
        ("[a-]", "a", false),
        ("[", "[", false),
        ("[]", "", false),
        ("[!]", "!", false),
        ("[a-z0-9]", "a", false),
        ("[z-a]", "b", false),
        ("[a", "a", false),
    ];

    #[test]
    fn matches_as_gobwas_glob_does() {
        for (pattern, text, want) in CASES {
            assert_eq!(
                glob_match(pattern, text),
                *want,
                "glob {pattern:?} against {text:?}"
            );
        }
    }

    #[test]
    fn invalid_patterns_say_why() {
        for (pattern, reason) in [
            ("e[[a*", "unexpected end of input"),
            ("[", "unexpected end of input"),
            ("[]", "could not parse range"),
            ("[a-z0-9]", "expected close range character"),
            ("[z-a]", "hi character should be greater than lo"),
        ] {
            let err = Glob::new(pattern).unwrap_err();
            assert_eq!(err.reason, reason, "{pattern:?}");
            assert!(err.to_string().contains(pattern), "{err}");
        }
        // gobwas closes an unclosed brace at the end.
        assert!(Glob::new("{a,b").unwrap().matches("b"));
    }

    #[test]
    fn pathological_patterns_match_in_linear_time() {
        let pattern = "*a".repeat(30) + "b";
        let text = "a".repeat(5000);
        let start = std::time::Instant::now();
        assert!(!glob_match(&pattern, &text));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    /// Argo CD's Test_MatchList (REGEXP and GLOB rows; look-around is not supported, see the
    /// module doc).
    #[test]
    fn lists_match_as_argocd_match_string_in_list() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(match_in_list(&l(&["*"]), "test"));
        assert!(match_in_list(&l(&["test"]), "test"));
        assert!(match_in_list(&l(&["other*", "te*"]), "test"));
        assert!(!match_in_list(&l(&["other"]), "test"));
        assert!(!match_in_list(&l(&[]), "test"));
        assert!(!match_in_list(&l(&[""]), "test"));
        assert!(match_in_list(&l(&["/^agent-[0-9]+$/"]), "agent-12"));
        assert!(match_in_list(&l(&["/gent/"]), "agent-12"), "unanchored");
        assert!(!match_in_list(&l(&["/^agent-[0-9]+$/"]), "agent-x"));
        assert!(match_in_list(&l(&["{dev,prod}-*"]), "prod-eu"));
        assert_eq!(validate_list(&l(&["a*", "/^x$/", "{a,b}"])), Ok(()));
        let err = validate_list(&l(&["ok", "[a-z0-9]"])).unwrap_err();
        assert!(err.contains("[a-z0-9]"), "{err}");
        let err = validate_list(&l(&["/(/"])).unwrap_err();
        assert!(err.contains("regular expression"), "{err}");
    }
}
