//! No import circles between the modules of the gateway, the agent, the transports, hw and
//! proto: a module that names `crate::a::…` or `super::…` depends on the deepest module of
//! that path, and those dependencies must form no cycle (a module's own parents aside, which
//! it may always name). A circle is where one module's rule hides in another's (how the
//! status limits once lived three times); a leaf module breaks it.
//!
//! Read from the source text, as `cargo modules dependencies --acyclic` would check it
//! from rust-analyzer's model, without building that tool for every run: paths in code and
//! attributes count, comments and `#[cfg(test)]` modules do not.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every module file of `src` (not tests, not generated code, not the binary's `main.rs`),
/// by module path (`writer::journal`; the crate root is `""`).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(rel) = path.strip_prefix(src) else {
                continue;
            };
            let Some(rel) = rel.to_str().and_then(|r| r.strip_suffix(".rs")) else {
                continue;
            };
            let mut parts: Vec<&str> = rel.split('/').collect();
            if parts == ["main"] || parts.iter().any(|p| *p == "tests" || *p == "gen") {
                continue;
            }
            if matches!(parts.last(), Some(&"lib") | Some(&"mod")) {
                parts.pop();
            }
            found.insert(parts.join("::"), path);
        }
    }
    found
}

/// The code of a module file: comments and a trailing `#[cfg(test)] mod tests { … }` cut.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines()
        .map(|line| match line.find("//") {
            // A URL in a string is cut too: at worst an edge on that line is missed.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `module` (at `path`) names, among `all`.
fn dependencies(module: &str, path: &Path, all: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let code = code(path);
    let mut named = BTreeSet::new();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start).map(|i| i + from) {
            from = at + start.len();
            // A whole word: not `my_crate::`; and a path's start, not the second `super` of
            // `super::super::` (read with the first).
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            // `crate::{a::b, c::{d, e}}` names `a::b`, `c::d` and `c::e`.
            for tree_path in expand(&code[from..]) {
                if let Some(candidate) = deepest(module, start, &tree_path, all) {
                    named.insert(candidate);
                }
            }
        }
    }
    named
}

/// The paths of the use tree (or plain path) at the start of `tree`, the text just after a
/// `crate::` or `super::`: `a::b::C` is `[a::b::C]`, `a::{b, c::{d, e}}` is
/// `[a::b, a::c::d, a::c::e]`, `{a::b, c}` is `[a::b, c]`. What follows the path (`;`,
/// `(`, a space) ends it.
fn expand(tree: &str) -> Vec<String> {
    let mut end = 0;
    for (i, c) in tree.char_indices() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            end = i + c.len_utf8();
            continue;
        }
        let prefix = &tree[..i];
        if c == '{' && (prefix.is_empty() || prefix.ends_with("::")) {
            let Some(close) = matching_brace(&tree[i..]) else {
                return vec![prefix.to_owned()];
            };
            return split_top_level(&tree[i + 1..i + close])
                .into_iter()
                .flat_map(|part| expand(part.trim_start()))
                .map(|path| format!("{prefix}{path}"))
                .collect();
        }
        break;
    }
    vec![tree[..end].to_owned()]
}

/// Where the `}` closing the `{` that `text` starts with is.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The parts of a use group's inside, split at its own commas (not at nested groups').
fn split_top_level(inside: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in inside.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inside[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inside[start..]);
    parts.retain(|part| !part.trim().is_empty());
    parts
}

/// The deepest module among `all` that `path` (written after `start`, `crate::` or
/// `super::`, in `module`) names, unless it is `module` itself or one of its parents.
fn deepest(
    module: &str,
    start: &str,
    path: &str,
    all: &BTreeMap<String, PathBuf>,
) -> Option<String> {
    // The lowercase segments of the path (modules and functions; a type ends it).
    let mut segments = Vec::new();
    for s in path.split("::") {
        let word = s
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if word.is_empty() || word.chars().any(|c| c.is_uppercase()) {
            break;
        }
        segments.push(word);
        if word.len() != s.len() {
            // The path ends inside this segment.
            break;
        }
    }
    let mut full: Vec<&str> = match start {
        "crate::" => Vec::new(),
        _ => {
            let mut parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
            parent.pop();
            // `super::super::x`: each further `super` is one level up.
            while segments.first() == Some(&"super") {
                segments.remove(0);
                parent.pop();
            }
            parent
        }
    };
    full.extend(segments);
    for len in (1..=full.len()).rev() {
        let candidate = full[..len].join("::");
        if all.contains_key(&candidate) {
            let own_parent = module.starts_with(&format!("{candidate}::"));
            return (candidate != module && !own_parent).then_some(candidate);
        }
    }
    None
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

fn module_graph(krate: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    let all = modules(&src);
    all.iter()
        .map(|(module, path)| (module.clone(), dependencies(module, path, &all)))
        .collect()
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for krate in ["gateway", "agent", "transports", "hw", "proto"] {
        let graph = module_graph(krate);
        assert!(graph.len() > 3, "{krate}: too few modules found: {graph:?}");
        for circle in circles(&graph) {
            let edges: Vec<String> = circle
                .iter()
                .map(|m| {
                    let inside: Vec<&str> = graph[m]
                        .iter()
                        .filter(|d| circle.contains(d))
                        .map(String::as_str)
                        .collect();
                    format!("{m} -> {}", inside.join(", "))
                })
                .collect();
            found.push(format!("{krate}: {}", edges.join("; ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The check finds a circle where there is one: two modules naming each other.
#[test]
fn a_circle_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"]),
        ("c", &["a"]),
        ("d", &["a"]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_owned(), deps.iter().map(|d| (*d).to_owned()).collect()))
    .collect();
    assert_eq!(circles(&graph), [["a", "b", "c"]]);
    // And the real graph's edges are read: the gateway's writer names the restriction
    // rules and the metrics' counters.
    let gateway = module_graph("gateway");
    assert!(
        gateway["writer"].contains("restriction") && gateway["writer"].contains("metrics"),
        "{:?}",
        gateway["writer"]
    );
}

/// Grouped imports are read as the paths they name.
#[test]
fn grouped_imports_are_expanded() {
    assert_eq!(expand("a::b::C;"), ["a::b::C"]);
    assert_eq!(
        expand("{a::b, c::{d, e as f}, g};"),
        ["a::b", "c::d", "c::e", "g"]
    );
    assert_eq!(
        expand("x::{\n    self,\n    y::{Z, w},\n};"),
        ["x::self", "x::y::Z", "x::y::w"]
    );
}
