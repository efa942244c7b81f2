//! `modcycles <crate>/src/lib.rs …`: the import cycles between a crate's modules.
//!
//! A module depends on another when any path in its code names an item there: a `use`
//! item, a type in a signature, a call in a function body, a constant's initialiser, a
//! path inside a macro's arguments (`crate::x::y`, `super::…`, `self::…`, or a child
//! module's name). Two modules that depend on each other, directly or through others,
//! parent and child included, are a cycle: each strongly connected component of two or
//! more modules is printed with its edges and, for each edge, where it was first seen.
//!
//! Not counted: `#[cfg(test)]` items and modules (tests may reach anywhere), re-exports
//! (`pub use`, `pub(crate) use`: a facade depends on nothing by naming), and declaring a
//! child module (`mod x;`). Exit status: 0 without cycles, 1 with, 2 when a file cannot be
//! read or parsed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module's path below the crate root (empty for the root).
type ModPath = Vec<String>;

fn display(m: &[String]) -> String {
    std::iter::once("crate").chain(m.iter().map(String::as_str)).collect::<Vec<_>>().join("::")
}

/// Where a reference was written.
#[derive(Clone, Debug)]
struct Site {
    file: PathBuf,
    line: usize,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A path written in module `from`, not yet resolved.
#[derive(Debug)]
struct Reference {
    from: ModPath,
    segments: Vec<String>,
    site: Site,
}

/// A `pub use`: the name it gives (`None` for a glob) and the path it names.
#[derive(Debug)]
struct Reexport {
    name: Option<String>,
    segments: Vec<String>,
}

#[derive(Default, Debug)]
struct Crate {
    /// Every module with the names of its child modules.
    modules: BTreeMap<ModPath, BTreeSet<String>>,
    /// The items each module declares (functions, types, constants, traits, macros).
    items: BTreeMap<ModPath, BTreeSet<String>>,
    /// Each module's re-exports, followed to the module that declares the item.
    reexports: BTreeMap<ModPath, Vec<Reexport>>,
    references: Vec<Reference>,
}

/// The name an item declares, if it declares one other modules can name.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The (name, path) pairs of a `use` tree; the name is `None` for a glob.
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Option<String>, Vec<String>, usize)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            let name = if n.ident == "self" { prefix.last().cloned() } else { Some(n.ident.to_string()) };
            if n.ident != "self" {
                path.push(n.ident.to_string());
            }
            out.push((name, path, n.ident.span().start().line));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((Some(r.rename.to_string()), path, r.ident.span().start().line));
        }
        syn::UseTree::Glob(g) => out.push((None, prefix.clone(), g.star_token.span.start().line)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_paths(t, prefix, out);
            }
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().split_whitespace().any(|t| t == "test"))
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl Crate {
    fn load(lib: &Path) -> Result<Crate, String> {
        let mut c = Crate::default();
        let dir = lib.parent().ok_or_else(|| format!("{}: no parent directory", lib.display()))?;
        c.load_file(lib, Vec::new(), dir)?;
        Ok(c)
    }

    /// A module's file, whose child modules live in `children_dir`.
    fn load_file(&mut self, file: &Path, module: ModPath, children_dir: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed =
            syn::parse_file(&text).map_err(|e| format!("{}:{}: {e}", file.display(), e.span().start().line))?;
        self.load_items(&parsed.items, module, file, children_dir)
    }

    fn load_items(
        &mut self,
        items: &[syn::Item],
        module: ModPath,
        file: &Path,
        children_dir: &Path,
    ) -> Result<(), String> {
        self.modules.entry(module.clone()).or_default();
        for item in items {
            if is_cfg_test(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    self.modules.entry(module.clone()).or_default().insert(name.clone());
                    let mut child = module.clone();
                    child.push(name.clone());
                    let dir = children_dir.join(&name);
                    match &m.content {
                        Some((_, inner)) => self.load_items(inner, child, file, &dir)?,
                        None => {
                            let flat = children_dir.join(format!("{name}.rs"));
                            let nested = dir.join("mod.rs");
                            let path = if flat.is_file() { flat } else { nested };
                            self.load_file(&path, child, &dir)?;
                        }
                    }
                }
                syn::Item::Use(u) if !matches!(u.vis, syn::Visibility::Inherited) => {
                    let mut paths = Vec::new();
                    use_paths(&u.tree, &mut Vec::new(), &mut paths);
                    let reexports = self.reexports.entry(module.clone()).or_default();
                    reexports.extend(paths.into_iter().map(|(name, segments, _)| Reexport { name, segments }));
                }
                _ => {
                    if let Some(name) = item_name(item) {
                        self.items.entry(module.clone()).or_default().insert(name);
                    }
                    let mut v = Collector { module: &module, file, out: &mut self.references };
                    v.visit_item(item);
                }
            }
        }
        Ok(())
    }

    /// The module a path names, if it names one of this crate's: the longest module
    /// prefix it resolves to, or, when the next name is a re-export there, the module
    /// that declares the item.
    fn resolve(&self, from: &[String], segments: &[String]) -> Option<ModPath> {
        self.resolve_within(from, segments, 0)
    }

    fn resolve_within(&self, from: &[String], segments: &[String], depth: usize) -> Option<ModPath> {
        let (module, next) = self.module_prefix(from, segments)?;
        let Some(name) = next else { return Some(module) };
        if depth > 16 || self.items.get(&module).is_some_and(|i| i.contains(name)) {
            return Some(module);
        }
        let reexports = self.reexports.get(&module).map(Vec::as_slice).unwrap_or_default();
        if let Some(r) = reexports.iter().find(|r| r.name.as_deref() == Some(name)) {
            return self.resolve_within(&module, &r.segments, depth + 1).or(Some(module));
        }
        for glob in reexports.iter().filter(|r| r.name.is_none()) {
            if let Some(source) = self.resolve_within(&module, &glob.segments, depth + 1) {
                let declares = self.items.get(&source).is_some_and(|i| i.contains(name))
                    || self.reexports.get(&source).is_some_and(|rs| rs.iter().any(|r| r.name.as_deref() == Some(name)));
                if declares {
                    return self.resolve_within(&source, std::slice::from_ref(name), depth + 1).or(Some(source));
                }
            }
        }
        Some(module)
    }

    /// The longest module prefix of a path and the name after it, if any.
    fn module_prefix<'p>(&self, from: &[String], segments: &'p [String]) -> Option<(ModPath, Option<&'p String>)> {
        let (mut base, rest): (ModPath, &[String]) = match segments.first()?.as_str() {
            "crate" => (Vec::new(), &segments[1..]),
            "self" => (from.to_vec(), &segments[1..]),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let keep = from.len().checked_sub(ups)?;
                (from[..keep].to_vec(), &segments[ups..])
            }
            first if self.modules.get(from).is_some_and(|c| c.contains(first)) => (from.to_vec(), segments),
            _ => return None,
        };
        let mut next = None;
        for s in rest {
            base.push(s.clone());
            if !self.modules.contains_key(&base) {
                base.pop();
                next = Some(s);
                break;
            }
        }
        Some((base, next))
    }

    /// Edges between distinct modules, each with the first place it was seen.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), Site> {
        let mut edges = BTreeMap::new();
        for r in &self.references {
            if let Some(to) = self.resolve(&r.from, &r.segments)
                && to != r.from
            {
                edges.entry((r.from.clone(), to)).or_insert_with(|| r.site.clone());
            }
        }
        edges
    }

    /// [`Self::edges`] with each edge between two modules that are neither the same nor
    /// one inside the other also lifted to the siblings that contain them: `types::bounds
    /// -> resolve::errors` is also `types -> resolve`, so that two top-level modules that
    /// depend on each other through their children are a cycle too. A lifted edge keeps
    /// the edge it came from.
    fn layered_edges(&self) -> BTreeMap<(ModPath, ModPath), Evidence> {
        let mut out = BTreeMap::new();
        for ((from, to), site) in self.edges() {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                let lifted = (from[..=common].to_vec(), to[..=common].to_vec());
                if lifted != (from.clone(), to.clone()) {
                    let via = Some((from.clone(), to.clone()));
                    out.entry(lifted).or_insert_with(|| Evidence { site: site.clone(), via });
                }
            }
            out.insert((from, to), Evidence { site, via: None });
        }
        out
    }
}

/// Where an edge was seen, and the deeper edge it was lifted from, if it was.
#[derive(Clone, Debug)]
struct Evidence {
    site: Site,
    via: Option<(ModPath, ModPath)>,
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.via {
            Some((a, b)) => write!(f, "via {} -> {}, {}", display(a), display(b), self.site),
            None => write!(f, "{}", self.site),
        }
    }
}

/// Collects every path of an item: `use` trees, `syn::Path`s, and paths in macro tokens.
struct Collector<'a> {
    module: &'a ModPath,
    file: &'a Path,
    out: &'a mut Vec<Reference>,
}

impl Collector<'_> {
    fn push(&mut self, segments: Vec<String>, line: usize) {
        if segments.len() >= 2 || segments.first().is_some_and(|s| matches!(s.as_str(), "crate" | "super" | "self")) {
            self.out.push(Reference {
                from: self.module.clone(),
                segments,
                site: Site { file: self.file.to_path_buf(), line },
            });
        }
    }

    /// `a::b::c` sequences of identifiers in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let line = first.span().start().line;
                    let mut segments = vec![first.to_string()];
                    let mut j = i + 1;
                    while j + 2 < trees.len() && is_path_sep(&trees[j], &trees[j + 1]) {
                        match &trees[j + 2] {
                            TokenTree::Ident(next) => segments.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    let preceded_by_sep = i >= 2 && is_path_sep(&trees[i - 2], &trees[i - 1]);
                    if !preceded_by_sep {
                        self.push(segments, line);
                    }
                    i = j.max(i + 1);
                }
                TokenTree::Punct(_) | TokenTree::Literal(_) => i += 1,
            }
        }
    }
}

fn is_path_sep(a: &TokenTree, b: &TokenTree) -> bool {
    matches!((a, b), (TokenTree::Punct(x), TokenTree::Punct(y))
        if x.as_char() == ':' && y.as_char() == ':' && x.spacing() == proc_macro2::Spacing::Joint)
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // Modules inside items are not part of this module's code.
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() && matches!(u.vis, syn::Visibility::Inherited) {
            let mut paths = Vec::new();
            use_paths(&u.tree, &mut Vec::new(), &mut paths);
            for (_, path, line) in paths {
                self.push(path, line);
            }
        }
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(super)`, `pub(crate)`, `pub(in path)` say who may see an item, not what it uses.
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none()
            && let Some(first) = p.segments.first()
        {
            let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, first.ident.span().start().line);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// Strongly connected components of two or more modules (Tarjan), each sorted.
fn cycles<E>(nodes: &BTreeSet<ModPath>, edges: &BTreeMap<(ModPath, ModPath), E>) -> Vec<Vec<ModPath>> {
    let index_of: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, n)| (n, i)).collect();
    let names: Vec<&ModPath> = nodes.iter().collect();
    let mut adjacency = vec![Vec::new(); names.len()];
    for (from, to) in edges.keys() {
        if let (Some(&a), Some(&b)) = (index_of.get(from), index_of.get(to)) {
            adjacency[a].push(b);
        }
    }
    struct Tarjan<'g> {
        adjacency: &'g [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        components: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn connect(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.adjacency[v] {
                match self.index[w] {
                    None => {
                        self.connect(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.components.push(component);
                }
            }
        }
    }
    let n = names.len();
    let mut t = Tarjan {
        adjacency: &adjacency,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.connect(v);
        }
    }
    let mut out: Vec<Vec<ModPath>> = t
        .components
        .into_iter()
        .map(|c| {
            let mut c: Vec<ModPath> = c.into_iter().map(|i| names[i].clone()).collect();
            c.sort();
            c
        })
        .collect();
    out.sort();
    out
}

/// The report of one crate: its cycles, each with its edges and where each was seen.
fn check(lib: &Path) -> Result<Vec<String>, String> {
    let c = Crate::load(lib)?;
    let nodes: BTreeSet<ModPath> = c.modules.keys().cloned().collect();
    let edges = c.layered_edges();
    Ok(cycles(&nodes, &edges)
        .into_iter()
        .map(|component| {
            let members: BTreeSet<&ModPath> = component.iter().collect();
            let mut text =
                format!("cycle between {}:", component.iter().map(|m| display(m)).collect::<Vec<_>>().join(", "));
            for ((from, to), site) in &edges {
                if members.contains(from) && members.contains(to) {
                    text.push_str(&format!("\n  {} -> {}   ({site})", display(from), display(to)));
                }
            }
            text
        })
        .collect())
}

fn main() -> ExitCode {
    let mut libs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    // `--edges <lib.rs>`: every edge of one crate with where it was first seen.
    if libs.first().is_some_and(|a| a == "--edges") && libs.len() == 2 {
        libs.remove(0);
        return match Crate::load(&libs[0]) {
            Ok(c) => {
                for ((from, to), site) in c.edges() {
                    println!("{} -> {}   ({site})", display(&from), display(&to));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if libs.is_empty() {
        eprintln!("usage: modcycles <crate>/src/lib.rs … | modcycles --edges <crate>/src/lib.rs");
        return ExitCode::from(2);
    }
    let mut found = false;
    for lib in &libs {
        match check(lib) {
            Ok(cycles) if cycles.is_empty() => println!("{}: no import cycles between modules", lib.display()),
            Ok(cycles) => {
                found = true;
                eprintln!("{}: modules that depend on each other", lib.display());
                for c in cycles {
                    eprintln!("{c}");
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if found { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        // Read at run time: cargo runs tests with it set, and a binary built in another
        // checkout of the same target directory would carry that checkout's path.
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test");
        Path::new(&dir).join("fixtures").join(name).join("lib.rs")
    }

    #[test]
    fn a_call_in_a_body_and_a_type_in_a_signature_make_a_cycle() {
        let report = check(&fixture("cyclic")).unwrap();
        assert_eq!(report.len(), 1, "{report:#?}");
        let lines: Vec<&str> = report[0].lines().map(|l| l.split("   (").next().unwrap().trim()).collect();
        assert_eq!(
            lines,
            [
                "cycle between crate::config, crate::rollback:",
                "crate::config -> crate::rollback",
                "crate::rollback -> crate::config"
            ]
        );
        assert!(report[0].contains("config.rs:6)"), "the edge's site: {}", report[0]);
    }

    #[test]
    fn every_kind_of_path_is_an_edge() {
        let c = Crate::load(&fixture("cyclic")).unwrap();
        let edges = c.edges();
        let has = |a: &str, b: &str| {
            let p = |s: &str| s.split("::").filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
            edges.contains_key(&(p(a), p(b)))
        };
        let table = [
            ("config", "rollback", true),      // a call in a method's body
            ("rollback", "config", true),      // a type in a signature, through the root's re-export
            ("rollback", "", false),           // … which is followed to the module that declares it
            ("types", "resolve", true),        // a constant's initialiser
            ("resolve", "plan", true),         // a path in a macro's arguments
            ("plan", "plan::detail", true),    // a child module by its bare name
            ("types::bounds", "types", true),  // super:: from a child
            ("types", "types::bounds", false), // declaring a child is not using it
            ("types::bounds", "", false),      // pub(super), pub(crate): visibility, not use
            ("facade", "config", false),       // a re-export
            ("config", "resolve", false),      // only in #[cfg(test)] code
            ("plan", "config", false),         // a local variable named like a module
        ];
        for (a, b, want) in table {
            assert_eq!(has(a, b), want, "{a} -> {b}; edges: {:?}", edges.keys().collect::<Vec<_>>());
        }
    }

    #[test]
    fn layers_that_depend_on_each_other_through_their_children_are_a_cycle() {
        let report = check(&fixture("nested")).unwrap();
        assert_eq!(report.len(), 1, "{report:#?}");
        let lines: Vec<&str> = report[0].lines().map(str::trim).collect();
        assert_eq!(lines[0], "cycle between crate::a, crate::b:");
        assert!(
            lines[1].starts_with("crate::a -> crate::b   (via crate::a::inner -> crate::b::leaf, "),
            "{}",
            report[0]
        );
        assert!(lines[2].starts_with("crate::b -> crate::a   (via crate::b::other -> crate::a, "), "{}", report[0]);
        assert_eq!(lines.len(), 3, "{}", report[0]);
    }

    #[test]
    fn an_acyclic_crate_passes() {
        assert_eq!(check(&fixture("acyclic")).unwrap(), Vec::<String>::new());
        // `crate::base()` names `low` through the root's glob re-export.
        let c = Crate::load(&fixture("acyclic")).unwrap();
        let edges: Vec<(String, String)> = c.edges().into_keys().map(|(a, b)| (display(&a), display(&b))).collect();
        assert_eq!(
            edges,
            [("crate::high".into(), "crate::low".into()), ("crate::high::step".into(), "crate::high".into())]
        );
    }
}
