//! The crate's import graph, file by file: which file uses an item defined in which other file.
//!
//! Read from the source as text, for this crate's style: `use` declarations (nested braces,
//! `self`, aliases, globs) and inline paths (`crate::…`, `super::…`, and paths that start at a
//! name a `use` brought in). A path is resolved to the file that *defines* the item, following
//! re-exports (`pub use`, `pub(crate) use`), so a file that only hands names on (a `mod.rs`
//! face, `engine/boundary.rs`) is not a dependency of its users, and its re-exports are not
//! dependencies of its own. Module declarations are containment, not imports. Macros brought in
//! by `#[macro_use]` are textual and not seen.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A module path inside one crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// One crate's source: its modules, the file behind each, and each file's imports.
pub struct Crate {
    /// Module → the file that holds it (an inline module maps to its enclosing file).
    files: BTreeMap<ModPath, PathBuf>,
    /// Module → the modules declared in it.
    children: HashMap<ModPath, BTreeSet<String>>,
    /// File → its re-exports: name → the path it re-exports (relative to the file's module).
    reexports: HashMap<PathBuf, Vec<Reexport>>,
    /// File → the paths it uses (not re-exports), each with the module it is used from.
    uses: HashMap<PathBuf, Vec<(ModPath, Vec<String>)>>,
}

struct Reexport {
    /// The module the `use` is written in.
    at: ModPath,
    /// The name it makes visible (`*` for a glob).
    name: String,
    /// The path it names.
    path: Vec<String>,
}

/// Source text with comments, strings and chars blanked out (newlines kept), so that what is
/// left is code.
pub fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings r"…", r#"…"#.
        if c == 'r' && (next == Some('"') || next == Some('#')) && (i == 0 || !is_ident(b[i - 1])) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&'"') {
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    if b[j] == '\n' {
                        out.push('\n');
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        // A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
        if c == '\'' {
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&k| b[k] == '\'')
            } else {
                (b.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            if let Some(k) = close {
                out.push_str("' '");
                i = k + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The use trees of `code`: `(is a re-export, the module-relative paths it brings in, with the
/// name each is bound to)`.
/// One `use` declaration: whether it is `pub`, and each imported path with its local name.
pub type UseDecl = (bool, Vec<(Vec<String>, String)>);

fn use_decls(code: &str) -> Vec<UseDecl> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let text: String = bytes.iter().collect();
    let mut from = 0;
    while let Some(off) = text[from..].find("use ") {
        let at = from + off;
        from = at + 4;
        // `use` as a keyword at the start of a declaration (after `;`, `{`, `}`, a newline or
        // a visibility), not inside an identifier.
        let before = text[..at].trim_end();
        let prefix_ok = at == 0
            || text[..at].ends_with(char::is_whitespace) && {
                let last = before.chars().last();
                matches!(last, None | Some(';' | '{' | '}' | ')' | ']')) || before.ends_with("pub")
            };
        if !prefix_ok || (at > 0 && is_ident(text[..at].chars().last().unwrap_or(' '))) {
            continue;
        }
        let reexport =
            before.ends_with("pub") || before.ends_with("pub(crate)") || before.ends_with("pub(super)");
        let Some(end) = text[at..].find(';') else { break };
        let tree = &text[at + 4..at + end];
        let mut leaves = Vec::new();
        expand(tree.trim(), &mut Vec::new(), &mut leaves);
        out.push((reexport, leaves));
        from = at + end;
    }
    out
}

/// Expands a use tree into its leaves: (path, bound name).
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim().trim_start_matches("::");
    if tree.is_empty() {
        return;
    }
    // Split at the first `{` at this level.
    if let Some(open) = tree.find('{') {
        let head = &tree[..open];
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        let base: Vec<String> =
            head.split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        let n = base.len();
        prefix.extend(base);
        for part in split_top(inner) {
            expand(part, prefix, out);
        }
        prefix.truncate(prefix.len() - n);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut segs: Vec<String> = prefix.clone();
    segs.extend(path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(String::from));
    if segs.last().is_some_and(|s| s == "self") {
        segs.pop();
    }
    let name = alias.unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
    out.push((segs, name));
}

/// Splits `s` at the commas that are not inside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Inline paths in `code` (outside `use` declarations) that start with `crate::`, `super::`,
/// `self::` or a name in `names`: their segments.
fn inline_paths(code: &str, names: &BTreeSet<String>) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != ':') {
            let mut segs = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                segs.push(chars[s..j].iter().collect::<String>());
                if chars.get(j) == Some(&':')
                    && chars.get(j + 1) == Some(&':')
                    && chars.get(j + 2).is_some_and(|c| is_ident(*c))
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1
                && (matches!(segs[0].as_str(), "crate" | "super" | "self") || names.contains(&segs[0]))
            {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// `code` cut into the code of each module it holds: the file's own (`[]`) and each inline
/// module's (`["markers"]`, nested ones deeper), each without the inline modules inside it.
fn inline_modules(code: &str) -> Vec<(Vec<String>, String)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out: Vec<(Vec<String>, String)> = vec![(Vec::new(), String::new())];
    // The stack of open inline modules: (index into `out`, brace depth at which it closes).
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut path: Vec<String> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let cur = stack.last().map_or(0, |s| s.0);
        // `mod NAME {` at a word boundary.
        if chars[i] == 'm'
            && (i == 0 || !is_ident(chars[i - 1]))
            && chars[i..].starts_with(&['m', 'o', 'd', ' '])
        {
            let mut j = i + 4;
            let s = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            let name: String = chars[s..j].iter().collect();
            let mut k = j;
            while k < chars.len() && chars[k].is_whitespace() {
                k += 1;
            }
            if !name.is_empty() && chars.get(k) == Some(&'{') {
                path.push(name);
                out.push((path.clone(), String::new()));
                depth += 1;
                stack.push((out.len() - 1, depth));
                i = k + 1;
                continue;
            }
        }
        match chars[i] {
            '{' => depth += 1,
            '}' => {
                if stack.last().is_some_and(|s| s.1 == depth) {
                    stack.pop();
                    path.pop();
                    depth -= 1;
                    i += 1;
                    continue;
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        out[cur].1.push(chars[i]);
        i += 1;
    }
    out
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `use` declarations removed from `code` (they are read apart).
fn without_uses(code: &str) -> String {
    let mut out = String::new();
    for line in code.lines() {
        let t = line.trim_start();
        if t.starts_with("use ")
            || t.starts_with("pub use ")
            || t.starts_with("pub(crate) use ")
            || t.starts_with("pub(super) use ")
        {
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

impl Crate {
    /// Reads the crate rooted at `root_file` (`src/lib.rs`): every file under its folder, but
    /// `skip` (another crate's folder).
    pub fn read(root_file: &Path, skip: Option<&Path>) -> Crate {
        let dir = root_file.parent().expect("root folder").to_path_buf();
        let mut all = Vec::new();
        sources(&dir, &mut all);
        let mut files = BTreeMap::new();
        let mut children: HashMap<ModPath, BTreeSet<String>> = HashMap::new();
        for f in all.iter().filter(|f| skip.is_none_or(|s| !f.starts_with(s))) {
            let rel = f.strip_prefix(&dir).expect("under the root");
            let mut m: ModPath =
                rel.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
            let last = m.pop().expect("a file name");
            if f == root_file {
                m.clear();
            } else if last != "mod.rs" {
                m.push(last.trim_end_matches(".rs").to_owned());
            }
            for k in 1..=m.len() {
                children.entry(m[..k - 1].to_vec()).or_default().insert(m[k - 1].clone());
            }
            files.insert(m, f.clone());
        }
        let mut krate = Crate { files, children, reexports: HashMap::new(), uses: HashMap::new() };
        let modules: Vec<(ModPath, PathBuf)> =
            krate.files.iter().map(|(m, f)| (m.clone(), f.clone())).collect();
        for (m, f) in modules {
            let code = without_test_modules(&code_only(&std::fs::read_to_string(&f).expect("read source")));
            let mut uses = Vec::new();
            let mut reexports = Vec::new();
            for (inner, code) in inline_modules(&code) {
                let at: ModPath = m.iter().cloned().chain(inner.iter().cloned()).collect();
                if !inner.is_empty() {
                    for k in 0..inner.len() {
                        let parent: ModPath = m.iter().cloned().chain(inner[..k].iter().cloned()).collect();
                        krate.children.entry(parent).or_default().insert(inner[k].clone());
                    }
                }
                let decls = use_decls(&code);
                let mut names = BTreeSet::new();
                for (reexport, leaves) in &decls {
                    for (path, name) in leaves {
                        if *reexport {
                            reexports.push(Reexport {
                                at: at.clone(),
                                name: name.clone(),
                                path: path.clone(),
                            });
                        } else {
                            uses.push((at.clone(), path.clone()));
                        }
                        if name != "*" {
                            names.insert(name.clone());
                        }
                    }
                }
                // Inline paths starting at an imported name are that import, taken further.
                let imported: HashMap<String, Vec<String>> = decls
                    .into_iter()
                    .flat_map(|(_, l)| l)
                    .filter(|(_, n)| n != "*")
                    .map(|(p, n)| (n, p))
                    .collect();
                // Child modules start paths too (`writer::spawn(…)`).
                let mut starts = names.clone();
                starts.extend(krate.children.get(&at).into_iter().flatten().cloned());
                for segs in inline_paths(&without_uses(&code), &starts) {
                    let full = match imported.get(&segs[0]) {
                        Some(p) if !matches!(segs[0].as_str(), "crate" | "super" | "self") => {
                            p.iter().cloned().chain(segs[1..].iter().cloned()).collect()
                        }
                        _ => segs,
                    };
                    uses.push((at.clone(), full));
                }
            }
            krate.reexports.insert(f.clone(), reexports);
            krate.uses.insert(f, uses);
        }
        krate
    }

    /// The file that holds module `m` (an inline module's enclosing file).
    fn file_of(&self, m: &[String]) -> Option<&PathBuf> {
        (0..=m.len()).rev().find_map(|k| self.files.get(&m[..k]))
    }

    /// The file that defines what `path`, written in module `at`, names; `None` outside this
    /// crate.
    fn resolve(&self, at: &[String], path: &[String], depth: usize) -> Option<PathBuf> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let mut m: ModPath = match path[0].as_str() {
            "crate" => Vec::new(),
            "super" | "self" => at.to_vec(),
            first => {
                // A child of `at`, or (2018 paths) an item of `at` itself; else another crate.
                if self.children.get(at).is_some_and(|c| c.contains(first)) {
                    at.to_vec()
                } else {
                    return None;
                }
            }
        };
        let mut rest = match path[0].as_str() {
            "crate" | "self" => &path[1..],
            _ => path,
        };
        while let Some(s) = rest.first() {
            match s.as_str() {
                "super" => {
                    m.pop();
                }
                "self" => {}
                name if self.children.get(&m).is_some_and(|c| c.contains(name)) => m.push(name.to_owned()),
                _ => break,
            }
            rest = &rest[1..];
        }
        let file = self.file_of(&m)?.clone();
        let Some(item) = rest.first() else { return Some(file) };
        // Re-exported by that module: resolve what it names.
        for r in self.reexports.get(&file).into_iter().flatten() {
            if r.at == m && (r.name == *item) {
                return self.resolve(&r.at, &r.path, depth + 1).or(Some(file));
            }
        }
        for r in self.reexports.get(&file).into_iter().flatten() {
            if r.at == m && r.name == "*" {
                let mut p = r.path.clone();
                p.pop();
                p.push(item.clone());
                if let Some(f) = self.resolve(&r.at, &p, depth + 1) {
                    return Some(f);
                }
            }
        }
        Some(file)
    }

    /// The import graph: file → the files it takes items from (itself left out).
    pub fn graph(&self) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
        let mut g: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
        for (f, uses) in &self.uses {
            let entry = g.entry(f.clone()).or_default();
            for (at, path) in uses {
                if let Some(to) = self.resolve(at, path, 0)
                    && to != *f
                {
                    entry.insert(to);
                }
            }
        }
        g
    }
}

/// Every import circle of `graph` (its strongly connected components of more than one file),
/// each as the files along it.
pub fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Tarjan's algorithm.
    struct T<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        next: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else { continue };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// `code` without what is compiled for tests only (`#[cfg(test)]` or `#[cfg(all(test, …))]` on
/// a module or an item): tests are not part of the structure.
pub fn without_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(off) = out[from..].find("#[cfg(") {
        let at = from + off;
        let Some(close) = out[at..].find(']') else { break };
        let attr = &out[at..at + close];
        let is_test = attr.split(|c: char| !is_ident(c)).any(|w| w == "test");
        if !is_test || attr.contains("not(test") {
            from = at + close;
            continue;
        }
        let after_attr = at + close + 1;
        // The item: up to its `;` or its matching `}`, whichever ends it.
        let rest = &out[after_attr..];
        let open = rest.find('{');
        let semi = rest.find(';');
        let end = match (open, semi) {
            (Some(o), s) if s.is_none_or(|s| s > o) => {
                let mut depth = 0;
                let mut end = None;
                for (i, c) in rest[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = Some(after_attr + o + i + 1);
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end.unwrap_or(out.len())
            }
            (_, Some(s)) => after_attr + s + 1,
            _ => out.len(),
        };
        let lines = out[at..end].matches('\n').count();
        out.replace_range(at..end, &"\n".repeat(lines));
        from = at;
    }
    out
}

/// The use trees of `code` (for the scanner's own test).
pub fn parse_uses(code: &str) -> Vec<UseDecl> {
    use_decls(code)
}
