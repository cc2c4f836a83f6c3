//! The source's rooms stay as `docs/architecture.md` describes them, read
//! from the source text alone:
//!
//! - **one way only**: no import cycle among `src/`'s modules at any level.
//!   Module `b` imports its sibling `a` when code inside `b` names a path
//!   through `a` (`crate::…::a::…`, or `super::a` resolving to it, or a
//!   re-export that leads to it); two siblings that import each other, or
//!   a longer circle of them, fail. Doc comments do not count;
//! - **a folder's `mod.rs` holds docs, `mod` lines and re-exports**: no
//!   module below a `mod.rs` names an item that `mod.rs` defines;
//! - **small files**: no file in `src/`, `layers/src` or `cli/src` has over 400 code
//!   lines (non-blank lines that are not `//` comments, before the first
//!   line that starts with `#[cfg(test)]`).
//!
//! The reader is a small lexer (comments, strings and characters left out)
//! and a walk of the `mod` declarations from `lib.rs`; it resolves `use`
//! declarations and re-exports module by module. It knows no macros beyond
//! `$crate::` paths and no glob re-exports (a glob import counts as an
//! import of its module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most code lines a source file may have.
const MAX_CODE_LINES: usize = 400;

/// The source folders whose files are held to [`MAX_CODE_LINES`], from the
/// workspace root.
const SIZED: &[&str] = &["src", "layers/src", "cli/src"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The crate in `src/`, as the reader sees it.
fn src() -> Crate {
    Crate::read(&workspace().join("src/lib.rs"))
}

/// Fails with `what` and every finding, one a line, unless there is none.
fn assert_none(findings: Vec<String>, what: &str) {
    assert!(findings.is_empty(), "{what}:\n{}", findings.join("\n"));
}

#[test]
fn src_modules_import_one_way_only() {
    assert_none(
        src().cycles(),
        "import cycles among src/'s modules (each edge with one place that makes it)",
    );
}

#[test]
fn no_mod_rs_holds_an_item_its_children_import() {
    assert_none(
        src().items_reached_in_mod_rs(),
        "a mod.rs holds docs, mod lines and re-exports; these items are defined in one and \
         imported below it (move each into a child file and re-export it)",
    );
}

#[test]
fn no_source_file_is_over_400_code_lines() {
    let files: Vec<PathBuf> = SIZED
        .iter()
        .flat_map(|folder| files_below(&workspace().join(folder)))
        .collect();
    assert!(
        files.len() > 50,
        "only {} files read: the walk missed folders",
        files.len()
    );
    let over = files
        .iter()
        .filter_map(|file| {
            let n = code_lines(&std::fs::read_to_string(file).expect("a source file"));
            (n > MAX_CODE_LINES).then(|| format!("{n} {}", file.display()))
        })
        .collect();
    assert_none(
        over,
        &format!("files over {MAX_CODE_LINES} code lines (split them by concern)"),
    );
}

#[test]
fn the_reader_finds_a_circle_of_sibling_files_and_the_re_export_it_goes_through() {
    let dir = scratch("circle");
    write(
        &dir,
        "lib.rs",
        "mod a;\nmod b;\nmod c;\npub use a::Thing;\n/// crate::c in a doc comment is no import\nfn f() {}\n",
    );
    write(
        &dir,
        "a.rs",
        "pub struct Thing;\nfn g() { crate::b::h(); }\n",
    );
    write(
        &dir,
        "b.rs",
        "pub fn h() { let _ = \"crate::a\"; }\nuse super::c::k;\n",
    );
    // c reaches a through the crate root's re-export.
    write(&dir, "c.rs", "pub fn k() { let _t = crate::Thing; }\n");
    let cycles = Crate::read(&dir.join("lib.rs")).cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("crate: a → b → c → a"),
        "{}",
        cycles[0]
    );
    std::fs::remove_dir_all(&dir).expect("remove the scratch folder");
}

#[test]
fn the_reader_finds_a_cycle_inside_a_folder_and_an_item_a_mod_rs_lends_its_children() {
    let dir = scratch("folder");
    write(&dir, "lib.rs", "pub mod room;\nmod other;\n");
    write(&dir, "other.rs", "use crate::room::Shared;\n");
    write(
        &dir,
        "room/mod.rs",
        "pub struct Shared;\nmod x;\nmod y;\npub use x::X;\n",
    );
    write(
        &dir,
        "room/x.rs",
        "use super::{y::Y, Shared};\npub struct X;\n",
    );
    write(
        &dir,
        "room/y.rs",
        "pub struct Y;\nmod inner {\n    fn f() { let _ = super::super::X; }\n}\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    let found = Crate::read(&dir.join("lib.rs"));
    let cycles = found.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(cycles[0].starts_with("room: x → y → x"), "{}", cycles[0]);
    let reached = found.items_reached_in_mod_rs();
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert!(reached[0].contains("room::Shared"), "{}", reached[0]);
    std::fs::remove_dir_all(&dir).expect("remove the scratch folder");
}

#[test]
fn code_lines_are_counted_as_the_hook_counts_them() {
    let text = "//! docs\n\nuse x;\n    // a comment\n    let a = 1; // trailing\n/// doc\nfn f() {}\n    #[cfg(test)]\nstill();\n#[cfg(test)]\nmod tests {}\n";
    // `use x;`, `let a`, `fn f`, the indented `#[cfg(test)]`, `still();`.
    assert_eq!(code_lines(text), 5);
}

// ---- Line counts ----

/// Non-blank lines not starting with `//`, before the first line that
/// starts with `#[cfg(test)]` (at its first column).
fn code_lines(text: &str) -> usize {
    text.lines()
        .take_while(|line| !line.starts_with("#[cfg(test)]"))
        .map(str::trim_start)
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .count()
}

/// Every `.rs` file below `dir`, sorted.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut todo = vec![dir.to_path_buf()];
    let mut found = Vec::new();
    while let Some(next) = todo.pop() {
        for entry in std::fs::read_dir(&next).expect("a source folder") {
            let path = entry.expect("a folder entry").path();
            match path.extension() {
                _ if path.is_dir() => todo.push(path),
                Some(ext) if ext == "rs" => found.push(path),
                _ => {}
            }
        }
    }
    found.sort();
    found
}

// ---- The lexer ----

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// An identifier or keyword (`r#` dropped), or a number.
    Word(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
}

/// The tokens of `text` with their line numbers (from 1): comments, string
/// and character literals and lifetimes left out.
fn lex(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(at(i) == '\n');
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"…", r#"…"#, br"…": up to the quote and as many hashes.
            i = chars[i..]
                .iter()
                .position(|&c| c == '"')
                .map_or(i, |p| i + p)
                + 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                line += usize::from(chars[i] == '\n');
                i += 1;
            }
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                let step = if chars[i] == '\\' { 2 } else { 1 };
                line += chars[i..(i + step).min(chars.len())]
                    .iter()
                    .filter(|&&c| c == '\n')
                    .count();
                i += step;
            }
            i += 1;
        } else if c == '\'' || (c == 'b' && at(i + 1) == '\'') {
            let start = if c == 'b' { i + 1 } else { i };
            // A character ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(start + 1) == '\\' {
                i = start + 2;
                while at(i) != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(start + 2) == '\'' {
                i = start + 3;
            } else {
                i = start + 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if c.is_alphanumeric() || c == '_' {
            let mut start = i;
            if c == 'r' && at(i + 1) == '#' && (at(i + 2).is_alphabetic() || at(i + 2) == '_') {
                start = i + 2;
            }
            i = start;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push((Token::Word(chars[start..i].iter().collect()), line));
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// At a `#[cfg(test)]` or `#[cfg(all(test, …))]` attribute followed by
/// `mod name`, how many tokens it takes to reach the `;` or `{` after the
/// name.
fn test_only(tokens: &[(Token, usize)]) -> Option<usize> {
    let word = |j: usize| match tokens.get(j) {
        Some((Token::Word(w), _)) => Some(w.as_str()),
        _ => None,
    };
    let punct = |j: usize, c: char| tokens.get(j).is_some_and(|(t, _)| *t == Token::Punct(c));
    let cfg = punct(0, '#') && punct(1, '[') && word(2) == Some("cfg") && punct(3, '(');
    let test = word(4) == Some("test")
        || (word(4) == Some("all") && punct(5, '(') && word(6) == Some("test"));
    if !(cfg && test) {
        return None;
    }
    let close = tokens.iter().position(|(t, _)| *t == Token::Punct(']'))?;
    (word(close + 1) == Some("mod") && word(close + 2).is_some()).then_some(close + 3)
}

/// At a raw string's start (`r"`, `r#`…`"`, `br"`…), how many `#` it has.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    // Not inside a word (`for"`, `bar#`).
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some(hashes)
}

// ---- The module tree, its imports and re-exports ----

type ModPath = Vec<String>;

/// Where a name leads: a path in this crate, or outside it.
#[derive(Clone, Debug)]
enum Target {
    Local(ModPath),
    Outside,
}

#[derive(Debug, Default)]
struct Module {
    /// The file it is in, and whether that file is a `mod.rs` (or `lib.rs`).
    file: PathBuf,
    folder_file: bool,
    /// Its child modules, files and inline ones.
    children: BTreeSet<String>,
    /// The names its `use` declarations bring in (globs left out).
    aliases: BTreeMap<String, Target>,
}

/// One path named in code: from which module, which absolute path, where.
#[derive(Debug)]
struct Reference {
    from: ModPath,
    path: ModPath,
    place: String,
}

#[derive(Debug, Default)]
struct Crate {
    modules: BTreeMap<ModPath, Module>,
    references: Vec<Reference>,
    /// The `use` declarations, resolved only once every module is known:
    /// (module, path as written, alias, place).
    uses: Vec<(ModPath, ModPath, Option<String>, String)>,
}

impl Crate {
    /// Reads the crate whose root is `lib`, following its `mod` lines.
    fn read(lib: &Path) -> Crate {
        let mut found = Crate::default();
        let mut files = vec![(lib.to_path_buf(), ModPath::new())];
        while let Some((file, path)) = files.pop() {
            files.extend(found.read_file(&file, path));
        }
        // Aliases first, over as many rounds as re-exports of re-exports
        // need; then what each `use` names.
        let uses = std::mem::take(&mut found.uses);
        for _ in 0..4 {
            for (module, written, alias, _) in &uses {
                if let (Some(alias), Some(target)) = (alias, found.absolute(module, written)) {
                    found
                        .modules
                        .get_mut(module)
                        .expect("a module read")
                        .aliases
                        .insert(alias.clone(), target);
                }
            }
        }
        for (module, written, _, place) in uses {
            if let Some(Target::Local(path)) = found.absolute(&module, &written) {
                found.references.push(Reference {
                    from: module,
                    path,
                    place,
                });
            }
        }
        found
    }

    /// Reads one file of module `path`; returns its child files.
    fn read_file(&mut self, file: &Path, path: ModPath) -> Vec<(PathBuf, ModPath)> {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let folder_file = name == "mod.rs" || name == "lib.rs";
        let children_dir = if folder_file {
            file.parent().expect("a folder").to_path_buf()
        } else {
            file.with_extension("")
        };
        self.modules.insert(
            path.clone(),
            Module {
                file: file.to_path_buf(),
                folder_file,
                ..Module::default()
            },
        );
        let tokens = lex(&text);
        let word = |i: usize| match tokens.get(i) {
            Some((Token::Word(w), _)) => Some(w.as_str()),
            _ => None,
        };
        let is = |i: usize, t: Token| tokens.get(i).is_some_and(|(x, _)| *x == t);
        let place = |line: usize| format!("{}:{line}", file.display());
        let mut child_files = Vec::new();
        // The inline modules open here: (module path, brace depth inside it).
        let mut inline: Vec<(ModPath, usize)> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < tokens.len() {
            let current = inline.last().map_or(&path, |(p, _)| p).clone();
            let line = tokens[i].1;
            match &tokens[i].0 {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d)| *d > depth) {
                        inline.pop();
                    }
                }
                Token::Punct('#') if test_only(&tokens[i..]).is_some() => {
                    // A test module: skip its `mod` line or its body.
                    let mut j = i + test_only(&tokens[i..]).expect("checked");
                    if is(j, Token::Punct('{')) {
                        let mut open = 0;
                        loop {
                            match tokens[j].0 {
                                Token::Punct('{') => open += 1,
                                Token::Punct('}') => open -= 1,
                                _ => {}
                            }
                            j += 1;
                            if open == 0 {
                                break;
                            }
                        }
                    } else {
                        j += 1;
                    }
                    i = j;
                    continue;
                }
                Token::Word(w) if w == "macro_rules" && is(i + 1, Token::Punct('!')) => {
                    // `#[macro_export]` or not, a macro is named from the
                    // crate root (`crate::name!`, `$crate::name!`).
                    if let Some(name) = word(i + 2) {
                        let mut at = current.clone();
                        at.push(name.to_owned());
                        self.modules
                            .entry(ModPath::new())
                            .or_default()
                            .aliases
                            .insert(name.to_owned(), Target::Local(at));
                    }
                }
                Token::Word(w) if w == "mod" => {
                    if let Some(child) = word(i + 1) {
                        let mut child_path = current.clone();
                        child_path.push(child.to_owned());
                        self.modules
                            .get_mut(&current)
                            .expect("the current module")
                            .children
                            .insert(child.to_owned());
                        if is(i + 2, Token::Punct(';')) {
                            let flat = children_dir.join(format!("{child}.rs"));
                            let folder = children_dir.join(child).join("mod.rs");
                            let child_file = if flat.exists() { flat } else { folder };
                            child_files.push((child_file, child_path));
                        } else if is(i + 2, Token::Punct('{')) {
                            self.modules.insert(
                                child_path.clone(),
                                Module {
                                    file: file.to_path_buf(),
                                    ..Module::default()
                                },
                            );
                            depth += 1;
                            inline.push((child_path, depth));
                            i += 3;
                            continue;
                        }
                        i += 2;
                        continue;
                    }
                }
                Token::Word(w) if w == "use" => {
                    let end = (i..tokens.len())
                        .find(|&j| is(j, Token::Punct(';')))
                        .unwrap_or(tokens.len());
                    let mut leaves = Vec::new();
                    use_tree(&tokens[i + 1..end], ModPath::new(), &mut leaves);
                    for (written, alias) in leaves {
                        self.uses
                            .push((current.clone(), written, alias, place(line)));
                    }
                    i = end + 1;
                    continue;
                }
                Token::Word(w)
                    if (w == "crate" || w == "super")
                        && is(i + 1, Token::PathSep)
                        && !(i > 0 && is(i - 1, Token::PathSep)) =>
                {
                    let mut written = ModPath::new();
                    let mut j = i;
                    while let Some(segment) = word(j) {
                        written.push(segment.to_owned());
                        if !is(j + 1, Token::PathSep) {
                            break;
                        }
                        j += 2;
                    }
                    // A type's own path ends in its name; a generic's `<`
                    // or a call's `(` ends it too: all of it is the path.
                    self.uses.push((current, written, None, place(line)));
                    i = j + 1;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        child_files
    }

    /// The absolute path that `written`, named in `module`, stands for:
    /// `crate::`, `super::` and `self::` resolved, a first segment naming a
    /// child module or an alias of `module` followed. `None` for a glob's
    /// own module reference.
    fn absolute(&self, module: &ModPath, written: &ModPath) -> Option<Target> {
        let mut segments = written.iter().peekable();
        let mut base = match segments.peek().map(|s| s.as_str()) {
            Some("crate") => {
                segments.next();
                ModPath::new()
            }
            Some("self") => {
                segments.next();
                module.clone()
            }
            Some("super") => {
                let mut base = module.clone();
                while segments.peek().is_some_and(|s| *s == "super") {
                    segments.next();
                    base.pop();
                }
                base
            }
            Some(first) => {
                let m = self.modules.get(module)?;
                if m.children.contains(first) {
                    module.clone()
                } else if let Some(target) = m.aliases.get(first) {
                    segments.next();
                    match target {
                        Target::Outside => return Some(Target::Outside),
                        Target::Local(p) => p.clone(),
                    }
                } else {
                    return Some(Target::Outside);
                }
            }
            None => return None,
        };
        base.extend(segments.cloned());
        Some(Target::Local(base))
    }

    /// Where `path` leads: the deepest module on it (re-exports followed),
    /// and the item named in that module if the path goes past it.
    fn resolve(&self, path: &ModPath) -> Option<(ModPath, Option<String>)> {
        let mut path = path.clone();
        for _ in 0..32 {
            let mut module = ModPath::new();
            let mut rest = path.iter();
            let mut followed = None;
            for segment in rest.by_ref() {
                let m = self.modules.get(&module)?;
                if m.children.contains(segment) {
                    module.push(segment.clone());
                } else if let Some(target) = m.aliases.get(segment) {
                    followed = Some(target.clone());
                    break;
                } else {
                    return Some((module, Some(segment.clone())));
                }
            }
            match followed {
                None => return Some((module, None)),
                Some(Target::Outside) => return None,
                Some(Target::Local(mut target)) => {
                    target.extend(rest.cloned());
                    path = target;
                }
            }
        }
        panic!("a circle of re-exports at {path:?}")
    }

    /// The edges between sibling modules: (parent, from, to) → a place.
    fn edges(&self) -> BTreeMap<(ModPath, String, String), String> {
        let mut edges = BTreeMap::new();
        for r in &self.references {
            let Some((target, _)) = self.resolve(&r.path) else {
                continue;
            };
            let shared = r
                .from
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if shared < r.from.len() && shared < target.len() {
                let key = (
                    r.from[..shared].to_vec(),
                    r.from[shared].clone(),
                    target[shared].clone(),
                );
                edges.entry(key).or_insert_with(|| r.place.clone());
            }
        }
        edges
    }

    /// Every circle of sibling modules, one line each with the places that
    /// make its edges.
    fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut graphs: BTreeMap<&ModPath, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
        for (parent, from, to) in edges.keys() {
            graphs
                .entry(parent)
                .or_default()
                .entry(from)
                .or_default()
                .insert(to);
        }
        let mut out = Vec::new();
        for (parent, graph) in graphs {
            for walk in circles(&graph) {
                let name = if parent.is_empty() {
                    "crate".to_owned()
                } else {
                    parent.join("::")
                };
                let mut places = Vec::new();
                for (from, to) in walk.iter().flat_map(|a| walk.iter().map(move |b| (a, b))) {
                    if let Some(place) =
                        edges.get(&(parent.clone(), from.to_string(), to.to_string()))
                    {
                        places.push(format!("  {from} → {to}: {place}"));
                    }
                }
                out.push(format!(
                    "{name}: {} → {}\n{}",
                    walk.join(" → "),
                    walk[0],
                    places.join("\n")
                ));
            }
        }
        out
    }

    /// Items a `mod.rs` (or `lib.rs`) defines that a module below it names.
    fn items_reached_in_mod_rs(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        for r in &self.references {
            let Some((target, Some(item))) = self.resolve(&r.path) else {
                continue;
            };
            let below = r.from.len() > target.len() && r.from.starts_with(&target);
            let m = &self.modules[&target];
            if below && m.folder_file && !m.children.contains(&item) {
                let mut named = target.clone();
                named.push(item);
                out.insert(format!(
                    "{} ({}), named at {}",
                    named.join("::"),
                    m.file.display(),
                    r.place
                ));
            }
        }
        out.into_iter().collect()
    }
}

/// The leaves of a `use` tree: each path as written and the name it brings
/// in (`None` for a glob).
fn use_tree(tokens: &[(Token, usize)], prefix: ModPath, out: &mut Vec<(ModPath, Option<String>)>) {
    let mut path = prefix;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].0 {
            Token::Word(w) if w == "as" => {
                if let Some((Token::Word(alias), _)) = tokens.get(i + 1) {
                    let alias = (alias != "_").then(|| alias.clone());
                    out.push((path.clone(), alias));
                }
                return;
            }
            Token::Word(w) => path.push(w.clone()),
            Token::PathSep => {}
            Token::Punct('*') => {
                out.push((path.clone(), None));
                return;
            }
            Token::Punct('{') => {
                // Split the group at its top-level commas.
                let mut depth = 0;
                let mut start = i + 1;
                for j in i + 1..tokens.len() {
                    match tokens[j].0 {
                        Token::Punct('{') => depth += 1,
                        Token::Punct('}') if depth == 0 => {
                            use_tree(&tokens[start..j], path.clone(), out);
                            return;
                        }
                        Token::Punct('}') => depth -= 1,
                        Token::Punct(',') if depth == 0 => {
                            use_tree(&tokens[start..j], path.clone(), out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            _ => {}
        }
        i += 1;
    }
    // `a::{self}` brings in `a`; otherwise the last segment.
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
    }
    if let Some(last) = path.last().cloned() {
        out.push((path, Some(last)));
    }
}

/// The circles of a directed graph: its strongly connected components of
/// more than one node, each listed along a path that walks it.
fn circles<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(*from).chain(to.iter().copied()))
        .collect();
    let reaches = |from: &'a str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(n) = todo.pop() {
            for &next in graph.get(n).into_iter().flatten() {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|&n| (n, reaches(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for &n in &nodes {
        if done.contains(n) || !reach[n].contains(n) {
            continue;
        }
        let component: BTreeSet<&str> = reach[n]
            .iter()
            .copied()
            .filter(|m| reach[m].contains(n))
            .collect();
        done.extend(component.iter().copied());
        // Walk it: from n, always to the first member not yet walked that
        // still reaches n; what is left (a branching component) is listed
        // after.
        let mut walk = vec![n];
        let mut at = n;
        while let Some(&next) = graph[at]
            .iter()
            .find(|m| component.contains(*m) && !walk.contains(m) && reach[*m].contains(n))
        {
            walk.push(next);
            at = next;
        }
        let rest: Vec<&str> = component
            .iter()
            .copied()
            .filter(|m| !walk.contains(m))
            .collect();
        walk.extend(rest);
        out.push(walk);
    }
    out
}

// ---- Scratch crates for the reader's own tests ----

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("acemq-rooms-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("create the folder");
    std::fs::write(&path, text).expect("write the scratch file");
}
