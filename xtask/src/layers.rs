//! The first step of `cargo xtask test`: `profiler/src` imports only downward. Each top-level
//! module sits in one layer of [`LAYERS`]; a file may name (`crate::x`, `use crate::{x, ..}`)
//! only modules of lower layers, never one of its own layer or above, so no two modules can
//! import each other in a circle either. docs/architecture.md explains the layers.
//!
//! A plain reading of the source, no build: comments, strings and character literals are
//! blanked, then every `crate::` path is taken. `super::` stays inside a module, and the crate
//! root (`main.rs`) names its modules without `crate::`: neither needs checking.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

/// The layers of `profiler/src`, bottom first. A module may import from lower layers only.
pub const LAYERS: &[&[&str]] = &[
    &["vocab", "signals"],
    &["kernel"],
    &["registry"],
    &["aggregation"],
    &["output"],
    &["run"],
    &["cli"],
    &["nodework"],
    &["agent", "demo", "study", "offline"],
    &["main"],
];

/// The crate root: items of `main.rs` are named `crate::Item`.
const ROOT: &str = "main";

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a file under `src` belongs to: `kernel/load.rs` -> `kernel`,
/// `cli.rs` -> `cli`, `main.rs` -> `main`.
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.strip_suffix(".rs").unwrap_or(&first).to_string()
}

/// `text` with comments, string and character literals replaced by spaces (newlines kept, so
/// that positions keep their line numbers).
fn blank_non_code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            // Nested block comments, as Rust has them.
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if (rest.starts_with(b"r\"") || rest.starts_with(b"r#"))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| body + p + close.len())
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '"'), else a lifetime, left alone.
            if rest.get(1) == Some(&b'\\') {
                i + 2
                    + rest[2..]
                        .iter()
                        .position(|&c| c == b'\'')
                        .map_or(0, |p| p + 1)
            } else if rest.get(2) == Some(&b'\'') {
                i + 3
            } else {
                i += 1;
                continue;
            }
        } else {
            i += 1;
            continue;
        };
        blank(&mut out, i, end);
        i = end.max(i + 1);
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every first segment named after `crate::` in `code`, with its line (1-based):
/// `crate::a::b` gives `a`; `crate::{a::b, c}` gives `a` and `c`.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let line_at = |pos: usize| 1 + b[..pos].iter().filter(|&&c| c == b'\n').count();
    let ident_at = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        let start = j;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        (start, &code[start..j])
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("crate::") {
        let at = from + p;
        from = at + "crate::".len();
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let (start, name) = ident_at(from);
        if !name.is_empty() {
            found.push((line_at(start), name.to_string()));
            continue;
        }
        if b.get(start) != Some(&b'{') {
            continue;
        }
        // A group: the first segment of each of its items.
        let (mut depth, mut j, mut item_start) = (0usize, start, true);
        while j < b.len() {
            match b[j] {
                b'{' => {
                    depth += 1;
                    if depth == 1 {
                        item_start = true;
                    }
                }
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                b',' if depth == 1 => item_start = true,
                c if depth == 1 && item_start && is_ident(c) => {
                    let (s, name) = ident_at(j);
                    found.push((line_at(s), name.to_string()));
                    item_start = false;
                    j = s + name.len();
                    continue;
                }
                _ => {}
            }
            j += 1;
        }
        from = j;
    }
    found
}

/// What is wrong with the imports of these files (paths relative to `src`, and their text):
/// one line per import against the layers, and per module missing from [`LAYERS`].
pub fn problems(files: &[(PathBuf, String)]) -> Vec<String> {
    let modules: BTreeSet<String> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut out = Vec::new();
    for m in &modules {
        if layer_of(m).is_none() {
            out.push(format!(
                "module `{m}` is in no layer: add it to xtask/src/layers.rs's LAYERS and docs/architecture.md"
            ));
        }
    }
    let mut edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for (path, text) in files {
        let from = module_of(path);
        for (line, name) in crate_paths(&blank_non_code(text)) {
            let to = if modules.contains(&name) {
                name
            } else {
                ROOT.to_string()
            };
            if to != from {
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| format!("{}:{line}", path.display()));
            }
        }
    }
    for ((from, to), at) in &edges {
        let (Some(lf), Some(lt)) = (layer_of(from), layer_of(to)) else {
            continue;
        };
        if lt >= lf {
            let cycle = edges.contains_key(&(to.clone(), from.clone()));
            out.push(format!(
                "{at}: `{from}` imports `{to}`, {}",
                if cycle {
                    format!("and `{to}` imports `{from}`: a circle")
                } else if lt == lf {
                    "a module of its own layer".to_string()
                } else {
                    "a higher layer".to_string()
                },
            ));
        }
    }
    out
}

/// Every `.rs` file under `src`, relative to it, with its text.
fn read_tree(src: &Path) -> Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p)
                    .with_context(|| format!("reading {}", p.display()))?;
                files.push((p.strip_prefix(src)?.to_path_buf(), text));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Fails, naming each offending import, unless `profiler/src` imports only downward.
pub fn check(src: &Path) -> Result<()> {
    let problems = problems(&read_tree(src)?);
    if problems.is_empty() {
        println!("layers: profiler/src imports only downward");
        return Ok(());
    }
    for p in &problems {
        eprintln!("layers: {p}");
    }
    let order: Vec<String> = LAYERS.iter().map(|l| l.join("|")).collect();
    bail!(
        "{} import(s) against the layers of docs/architecture.md (bottom first: {})",
        problems.len(),
        order.join(" < ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source files: (path under `src/`, text).
    type Files<'a> = [(&'a str, &'a str)];

    /// The one problem found in `files` (failing unless there is exactly one).
    fn only_problem(files: &Files) -> String {
        let mut p = problems(&tree(files));
        assert_eq!(p.len(), 1, "{p:?}");
        p.remove(0)
    }

    fn tree(files: &Files) -> Vec<(PathBuf, String)> {
        files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect()
    }

    #[test]
    fn downward_imports_pass() {
        let t = tree(&[
            ("main.rs", "mod kernel; mod run;\nuse crate::run::go;"),
            ("vocab/mod.rs", "pub struct Id;"),
            ("kernel/mod.rs", "use crate::vocab::Id;"),
            (
                "run/mod.rs",
                "use crate::{\n    kernel::{a, b},\n    vocab::Id,\n};\nfn f() { crate::output::x(); }",
            ),
            ("output/text.rs", "use crate::output::lines;\nuse super::*;"),
        ]);
        assert_eq!(problems(&t), Vec::<String>::new());
    }

    /// Each tree holds one import against the layers; its one problem names it, at its start
    /// (`true`: with the file and line first) or anywhere.
    #[test]
    fn an_import_against_the_layers_is_named() {
        let cases: [(&Files, bool, &str); 5] = [
            // Upward, named with its file and line.
            (
                &[
                    ("vocab/mod.rs", ""),
                    (
                        "kernel/load.rs",
                        "//! loads\n\nfn f() {\n    crate::registry::ids::x();\n}",
                    ),
                    ("registry/mod.rs", "use crate::vocab::Id;"),
                ],
                true,
                "kernel/load.rs:4: `kernel` imports `registry`, a higher layer",
            ),
            // A circle, named as one.
            (
                &[
                    ("vocab/mod.rs", ""),
                    (
                        "registry/mod.rs",
                        "use crate::{vocab::Id, aggregation::Window};",
                    ),
                    ("aggregation/mod.rs", "use crate::registry::roles::Role;"),
                ],
                false,
                "`registry` imports `aggregation`, and `aggregation` imports `registry`: a circle",
            ),
            // Modules of one layer may not import each other.
            (
                &[
                    ("demo.rs", "use crate::study::SCENARIOS;"),
                    ("study/mod.rs", ""),
                ],
                false,
                "a module of its own layer",
            ),
            // Items of the crate root are the top layer.
            (
                &[("output/mod.rs", "fn f() -> crate::Error { todo!() }")],
                false,
                "`output` imports `main`",
            ),
            // A module in no layer.
            (
                &[("newthing/mod.rs", "use crate::vocab::Id;")],
                true,
                "module `newthing` is in no layer",
            ),
        ];
        for (files, at_start, says) in cases {
            let p = only_problem(files);
            let found = if at_start {
                p.starts_with(says)
            } else {
                p.contains(says)
            };
            assert!(found, "{p:?} does not say {says:?}");
        }
    }

    #[test]
    fn comments_and_strings_are_not_imports() {
        let t = tree(&[
            ("vocab/mod.rs", ""),
            (
                "kernel/mod.rs",
                "//! See [`x`](crate::run::x).\n/* crate::agent /* nested */ crate::cli */\n\
             const S: &str = \"crate::run\";\nconst R: &str = r#\"crate::demo \"quoted\"\"#;\n\
             const C: char = '\"'; fn f<'a>(x: &'a str) -> &'a str { x }\nuse crate::vocab::Id;",
            ),
        ]);
        assert_eq!(problems(&t), Vec::<String>::new());
    }

    #[test]
    fn the_profiler_imports_only_downward() {
        check(&crate::workspace_root().join("profiler/src")).unwrap();
    }
}
