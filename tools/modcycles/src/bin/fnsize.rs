//! `fnsize --max-lines N --max-args M <file or folder> …`: the functions that are too long
//! or take too many arguments.
//!
//! A function's length is the lines from its signature to its closing brace, doc
//! comments and attributes excluded. Counted: free functions, methods in `impl` blocks and
//! default methods in traits, also inside nested modules. Arguments count `self`. Not
//! counted: `#[cfg(test)]` modules and functions, `#[test]` functions, and files named
//! `tests.rs` or under a `tests/` folder (tables of cases are long by design). Exit status:
//! 0 when every function is within both bounds, 1 otherwise, 2 when a file cannot be read
//! or parsed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use syn::spanned::Spanned;
use syn::visit::Visit;

#[derive(Debug)]
struct Finding {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
    args: usize,
}

struct Walker<'a> {
    file: &'a Path,
    found: Vec<Finding>,
    owner: Option<String>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if a.path().is_ident("test") {
            return true;
        }
        if a.path().is_ident("cfg") {
            let text = a.meta.require_list().map(|l| l.tokens.to_string()).unwrap_or_default();
            return text.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == "test");
        }
        false
    })
}

impl Walker<'_> {
    fn record(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.span().start().line;
        let end = block.span().end().line;
        let name = match &self.owner {
            Some(owner) => format!("{owner}::{name}"),
            None => name.to_string(),
        };
        self.found.push(Finding {
            file: self.file.to_path_buf(),
            line: start,
            name,
            lines: end + 1 - start,
            args: sig.inputs.len(),
        });
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let ty = &i.self_ty;
        let previous = self.owner.replace(quote_type(ty));
        syn::visit::visit_item_impl(self, i);
        self.owner = previous;
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            self.record(&f.sig.ident, &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        let previous = self.owner.replace(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.owner = previous;
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default
            && !is_test(&f.attrs)
        {
            self.record(&f.sig.ident, &f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
        _ => "_".to_string(),
    }
}

fn sources(root: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if root.is_file() {
        out.push(root.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(root)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn scan(file: &Path) -> Result<Vec<Finding>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    scan_text(file, &text)
}

fn scan_text(file: &Path, text: &str) -> Result<Vec<Finding>, String> {
    let ast = syn::parse_file(text).map_err(|e| format!("{}:{}: {e}", file.display(), e.span().start().line))?;
    let mut walker = Walker { file, found: Vec::new(), owner: None };
    walker.visit_file(&ast);
    Ok(walker.found)
}

struct Args {
    max_lines: usize,
    max_args: usize,
    roots: Vec<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut max_lines = usize::MAX;
    let mut max_args = usize::MAX;
    let mut roots = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |flag: &str| -> Result<usize, String> {
            let value = args.next().ok_or(format!("{flag} needs a number"))?;
            value.parse().map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match arg.as_str() {
            "--max-lines" => max_lines = number("--max-lines")?,
            "--max-args" => max_args = number("--max-args")?,
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}")),
            _ => roots.push(PathBuf::from(arg)),
        }
    }
    if roots.is_empty() {
        return Err("usage: fnsize [--max-lines N] [--max-args M] <file or folder> …".into());
    }
    Ok(Args { max_lines, max_args, roots })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("fnsize: {e}");
            return ExitCode::from(2);
        }
    };
    let mut files = Vec::new();
    for root in &args.roots {
        if let Err(e) = sources(root, &mut files) {
            eprintln!("fnsize: {}: {e}", root.display());
            return ExitCode::from(2);
        }
    }
    let mut over = 0;
    for file in &files {
        let found = match scan(file) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("fnsize: {e}");
                return ExitCode::from(2);
            }
        };
        for f in found {
            let long = f.lines > args.max_lines;
            let wide = f.args > args.max_args;
            if long || wide {
                over += 1;
                println!("{}:{}: {} ({} lines, {} arguments)", f.file.display(), f.line, f.name, f.lines, f.args);
            }
        }
    }
    if over == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_functions_methods_and_defaults_but_not_tests() {
        let text = "
/// Docs are not counted.
#[inline]
fn three(a: u8, b: u8) -> u8 {
    a + b
}

struct S;
impl S {
    fn method(&self, x: u8, y: u8, z: u8, w: u8, v: u8) {
        let _ = (x, y, z, w, v);
    }
}

trait T {
    fn default(&self) {
        // one
        // two
    }
    fn required(&self);
}

#[cfg(test)]
mod tests {
    fn helper() {}
    #[test]
    fn case() {}
}

#[test]
fn alone() {}
";
        let found = scan_text(Path::new("x.rs"), text).unwrap();
        let got: Vec<(&str, usize, usize, usize)> =
            found.iter().map(|f| (f.name.as_str(), f.line, f.lines, f.args)).collect();
        assert_eq!(got, [("three", 4, 3, 2), ("S::method", 10, 3, 6), ("T::default", 16, 4, 1)]);
    }
}
