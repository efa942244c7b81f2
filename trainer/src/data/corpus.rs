//! The embedded synthetic corpus: four deterministic, learnable sources generated from
//! templates (`textbook`, `facts`, `arithmetic`, `mcq`).
//!
//! Everything is driven by `ChaCha8Rng` through [`Rng`], which only uses `next_u64`, so
//! the bytes do not depend on `rand`'s distribution algorithms and are identical on every
//! machine. Bump [`CORPUS_VERSION`] whenever the output changes (the pinned hashes in the
//! tests catch accidental changes); caches of tokenizers and token streams are keyed by it.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::Error;

/// Version of the generators' output; part of every cache key derived from the corpus.
pub const CORPUS_VERSION: u32 = 2;

/// Names of the sources, in the order of `crds::resolve::EMBEDDED_SOURCES`.
pub const SOURCES: [&str; 4] = ["textbook", "facts", "arithmetic", "mcq"];

/// Seed of the fixed synthetic world that `facts` and `mcq` talk about. It is not the
/// run seed: every run, split and tokenizer sees the same world.
const WORLD_SEED: u64 = 0x05ee_d0f7_ac75;

/// One in `VALIDATION_MODULUS` documents (by a hash of the text; for `mcq`, of the
/// question and its answer) belongs to the validation split, so the splits never share
/// a document.
pub const VALIDATION_MODULUS: u64 = 8;

/// Which document stream. The splits use distinct random streams and partition the
/// possible documents (`mcq`: question-answer pairs) by hash, so they are disjoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training stream.
    Train,
    /// Held-out documents for evaluation.
    Validation,
}

impl Split {
    fn index(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Validation => 1,
        }
    }

    /// Lowercase name, used in cache file names.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
        }
    }
}

/// Generates documents of `source` until their total size reaches `n_bytes` (the last
/// document may overshoot). A larger `n_bytes` extends the same stream.
pub fn documents(source: &str, seed: u64, split: Split, n_bytes: usize) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    let mut total = 0;
    for doc in stream(source, seed, split)? {
        if total >= n_bytes {
            break;
        }
        total += doc.len();
        out.push(doc);
    }
    Ok(out)
}

/// The endless document stream of `source`; [`documents`] takes a prefix of it.
pub fn stream(source: &str, seed: u64, split: Split) -> Result<DocStream, Error> {
    let kind = source_index(source)?;
    Ok(DocStream { kind, rng: Rng::new(seed, (kind as u64) * 2 + split.index()), split })
}

/// The index of `source` in [`SOURCES`], or an error naming it and the valid names.
pub fn source_index(source: &str) -> Result<usize, Error> {
    SOURCES.iter().position(|s| *s == source).ok_or_else(|| Error::Data {
        name: source.to_string(),
        message: format!("no embedded source of that name; valid names are {}", SOURCES.join(", ")),
    })
}

/// Iterator over the documents of one source and split; see [`stream`].
pub struct DocStream {
    kind: usize,
    rng: Rng,
    split: Split,
}

impl Iterator for DocStream {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let w = world();
        if self.kind == 3 {
            return Some(mcq_record(&mut self.rng, w, self.split, false).text());
        }
        loop {
            let doc = match self.kind {
                0 => textbook_doc(&mut self.rng),
                1 => facts_doc(&mut self.rng, w),
                _ => arithmetic_doc(&mut self.rng),
            };
            if split_of(&doc) == self.split {
                return Some(doc);
            }
        }
    }
}

/// A multiple-choice question with its gold answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McqRecord {
    /// The question, without the `Question: ` prefix.
    pub question: String,
    /// Options A to D.
    pub options: [String; 4],
    /// Index of the correct option, 0..4 (A..D).
    pub answer: usize,
}

impl McqRecord {
    /// The letter of option `i` (0 → 'A').
    pub fn letter(i: usize) -> char {
        (b'A' + i as u8) as char
    }

    /// The text up to and including `Answer:`, which a policy completes with a letter.
    pub fn prompt(&self) -> String {
        let o = &self.options;
        format!("Question: {}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:", self.question, o[0], o[1], o[2], o[3])
    }

    /// The split this question belongs to, by a hash of the question and its answer.
    pub fn split(&self) -> Split {
        split_of(&format!("{}\n{}", self.question, self.options[self.answer]))
    }

    /// The full document: the prompt, a space and the gold letter.
    pub fn text(&self) -> String {
        format!("{} {}", self.prompt(), Self::letter(self.answer))
    }
}

/// The first `n` multiple-choice records of the `mcq` stream for `seed` and `split`
/// (the same records, as text, that `documents("mcq", seed, split, ..)` yields).
pub fn mcq_records(seed: u64, n: usize, split: Split) -> Vec<McqRecord> {
    let mut rng = Rng::new(seed, 3 * 2 + split.index());
    (0..n).map(|_| mcq_record(&mut rng, world(), split, false)).collect()
}

/// The first `n` rule questions for `seed` and `split` (the `mcq-rules` GRPO task): each
/// names its answer's position, as a fifth of the `mcq` stream's questions do.
pub fn mcq_rule_records(seed: u64, n: usize, split: Split) -> Vec<McqRecord> {
    let mut rng = Rng::new(seed, 4 * 2 + split.index());
    (0..n).map(|_| mcq_record(&mut rng, world(), split, true)).collect()
}

// ---------------------------------------------------------------------------------------
// Randomness

struct Rng(ChaCha8Rng);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(stream);
        Rng(r)
    }

    /// Uniform in 0..n (n is tiny, so the modulo bias is negligible).
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n as u64) as usize
    }

    fn range(&mut self, lo: u32, hi_inclusive: u32) -> u32 {
        lo + self.below((hi_inclusive - lo + 1) as usize) as u32
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }

    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }

    /// `k` distinct indices from 0..n, in random order.
    fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        self.shuffle(&mut all);
        all.truncate(k);
        all
    }
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// "a", "a and b", "a, b and c".
fn join_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [a] => a.to_string(),
        [rest @ .., last] => format!("{} and {}", rest.join(", "), last),
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" }
}

// ---------------------------------------------------------------------------------------
// The facts world

const COLORS: &[&str] = &["red", "blue", "green", "yellow", "white", "black", "orange", "purple"];
const PROFESSIONS: &[&str] = &[
    "baker", "painter", "sailor", "doctor", "teacher", "farmer", "miner", "weaver", "builder", "singer", "judge",
    "chemist",
];
const PRODUCTS: &[&str] =
    &["glass", "wool", "cheese", "clocks", "paper", "salt", "wine", "silk", "boats", "bells", "honey", "tea"];
const STATES: &[&str] = &["solid", "liquid", "gas"];
const FIRST_NAMES: &[&str] = &[
    "Ada", "Bruno", "Clara", "Dario", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Leo", "Mara",
    "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Umar", "Vera", "Walt", "Yara", "Zeno",
];
const SYLLABLES: &[&str] = &[
    "bel", "mor", "tov", "rin", "kas", "dal", "vel", "nor", "sa", "lin", "gar", "ost", "mi", "fen", "tal", "bri",
    "cor", "dun", "el", "han", "qua", "zer", "pol", "ves",
];

const N_COUNTRIES: usize = 6;
const N_TOWNS: usize = 24;
const N_PEOPLE: usize = 36;
const N_ELEMENTS: usize = 12;
const N_RIVERS: usize = 8;

struct Country {
    name: String,
    language: String,
    capital: usize,
}

struct Town {
    name: String,
    country: usize,
    founded: u32,
    river: usize,
    product: usize,
}

struct Person {
    name: String,
    town: usize,
    profession: usize,
    color: usize,
    born: u32,
}

struct Element {
    name: String,
    color: usize,
    state: usize,
    discoverer: usize,
    year: u32,
}

struct World {
    countries: Vec<Country>,
    towns: Vec<Town>,
    people: Vec<Person>,
    elements: Vec<Element>,
    rivers: Vec<String>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| World::generate(WORLD_SEED))
}

impl World {
    fn generate(seed: u64) -> World {
        let mut rng = Rng::new(seed, 0);
        let mut used = BTreeSet::new();
        let mut name = |rng: &mut Rng, syllables: usize, suffix: &str| loop {
            let mut n: String = (0..syllables).map(|_| *rng.pick(SYLLABLES)).collect();
            n.push_str(suffix);
            if used.insert(n.clone()) {
                return capitalize(&n);
            }
        };
        let countries: Vec<(String, String)> = (0..N_COUNTRIES)
            .map(|_| {
                let n = name(&mut rng, 2, "ia");
                let language = format!("{}ish", &n[..n.len() - 2]);
                (n, language)
            })
            .collect();
        let rivers = (0..N_RIVERS).map(|_| name(&mut rng, 2, "")).collect();
        let mut founded_years = BTreeSet::new();
        let towns: Vec<Town> = (0..N_TOWNS)
            .map(|i| {
                let founded = loop {
                    let y = rng.range(1100, 1899);
                    if founded_years.insert(y) {
                        break y;
                    }
                };
                Town {
                    name: name(&mut rng, 2 + (i % 2), ""),
                    country: i % N_COUNTRIES,
                    founded,
                    river: rng.below(N_RIVERS),
                    product: rng.below(PRODUCTS.len()),
                }
            })
            .collect();
        // The capital of country c is its first town, c itself (towns go round the countries).
        let countries = countries
            .into_iter()
            .enumerate()
            .map(|(c, (name, language))| Country { name, language, capital: c })
            .collect();
        let mut people_names = BTreeSet::new();
        let people: Vec<Person> = (0..N_PEOPLE)
            .map(|_| {
                let full = loop {
                    let full = format!("{} {}", rng.pick(FIRST_NAMES), name(&mut rng, 2, ""));
                    if people_names.insert(full.clone()) {
                        break full;
                    }
                };
                Person {
                    name: full,
                    town: rng.below(N_TOWNS),
                    profession: rng.below(PROFESSIONS.len()),
                    color: rng.below(COLORS.len()),
                    born: rng.range(1800, 1990),
                }
            })
            .collect();
        let elements = (0..N_ELEMENTS)
            .map(|_| {
                let name = name(&mut rng, 2, "ium").to_lowercase();
                let (color, state) = (rng.below(COLORS.len()), rng.below(STATES.len()));
                let discoverer = rng.below(N_PEOPLE);
                let year = people[discoverer].born + rng.range(20, 60);
                Element { name, color, state, discoverer, year }
            })
            .collect();
        World { countries, towns, people, elements, rivers }
    }
}

fn facts_doc(rng: &mut Rng, w: &World) -> String {
    let mut s: Vec<String> = Vec::new();
    match rng.below(10) {
        0 | 1 => {
            let ci = rng.below(N_COUNTRIES);
            let c = &w.countries[ci];
            let cap = &w.towns[c.capital].name;
            s.push(match rng.below(3) {
                0 => format!("{} is a country. Its capital is {cap}.", c.name),
                1 => format!("The capital of {} is {cap}.", c.name),
                _ => format!("{cap} is the capital of {}.", c.name),
            });
            s.push(match rng.below(2) {
                0 => format!("The people of {} speak {}.", c.name, c.language),
                _ => format!("In {} people speak {}.", c.name, c.language),
            });
            let towns: Vec<&str> =
                (0..N_TOWNS).filter(|t| w.towns[*t].country == ci).map(|t| w.towns[t].name.as_str()).collect();
            s.push(format!("The towns of {} are {}.", c.name, join_list(&towns)));
        }
        2..=4 => {
            let ti = rng.below(N_TOWNS);
            let t = &w.towns[ti];
            let country = &w.countries[t.country].name;
            let mut parts = vec![
                match rng.below(2) {
                    0 => format!("{} is a town in {country}.", t.name),
                    _ => format!("The town of {} lies in {country}.", t.name),
                },
                match rng.below(2) {
                    0 => format!("It was founded in {}.", t.founded),
                    _ => format!("{} was founded in the year {}.", t.name, t.founded),
                },
                format!("{} lies on the river {}.", t.name, w.rivers[t.river]),
                match rng.below(2) {
                    0 => format!("{} is known for its {}.", t.name, PRODUCTS[t.product]),
                    _ => format!("The town is famous for {}.", PRODUCTS[t.product]),
                },
            ];
            rng.shuffle(&mut parts[1..]);
            s.extend(parts);
            if w.countries[t.country].capital == ti {
                s.push(format!("{} is the capital of {country}.", t.name));
            }
        }
        5..=7 => {
            let pi = rng.below(N_PEOPLE);
            let p = &w.people[pi];
            let first = p.name.split(' ').next().unwrap_or(&p.name);
            let prof = PROFESSIONS[p.profession];
            let town = &w.towns[p.town].name;
            let mut parts = vec![
                match rng.below(3) {
                    0 => format!("{} is {} {prof} who lives in {town}.", p.name, article(prof)),
                    1 => format!("{} works as {} {prof} in {town}.", p.name, article(prof)),
                    _ => format!("{} lives in {town}. {first} is {} {prof}.", p.name, article(prof)),
                },
                format!("{first} was born in {}.", p.born),
                match rng.below(2) {
                    0 => format!("The favorite color of {first} is {}.", COLORS[p.color]),
                    _ => format!("{first} likes the color {}.", COLORS[p.color]),
                },
            ];
            rng.shuffle(&mut parts[1..]);
            s.extend(parts);
            let found: Vec<&str> = w.elements.iter().filter(|e| e.discoverer == pi).map(|e| e.name.as_str()).collect();
            if !found.is_empty() {
                s.push(format!("{first} discovered {}.", join_list(&found)));
            }
        }
        8 => {
            let e = &w.elements[rng.below(N_ELEMENTS)];
            let who = &w.people[e.discoverer].name;
            let name = capitalize(&e.name);
            let (color, state) = (COLORS[e.color], STATES[e.state]);
            s.push(format!("{name} is an element."));
            s.push(match rng.below(2) {
                0 => format!("It is a {state} and its color is {color}."),
                _ => format!("{name} is {} {color} {state}.", article(color)),
            });
            s.push(match rng.below(2) {
                0 => format!("{name} was discovered by {who} in {}.", e.year),
                _ => format!("{who} discovered {} in {}.", e.name, e.year),
            });
        }
        _ => {
            // A comparison, derived from two towns' founding years.
            let ij = rng.distinct(N_TOWNS, 2);
            let (a, b) = (&w.towns[ij[0]], &w.towns[ij[1]]);
            let (older, newer) = if a.founded < b.founded { (a, b) } else { (b, a) };
            s.push(format!("{} was founded in {} and {} was founded in {}.", a.name, a.founded, b.name, b.founded));
            s.push(match rng.below(2) {
                0 => format!("So {} is older than {}.", older.name, newer.name),
                _ => format!("So {} is younger than {}.", newer.name, older.name),
            });
        }
    }
    s.join(" ")
}

// ---------------------------------------------------------------------------------------
// Arithmetic

const ITEMS: &[&str] = &["apples", "books", "coins", "eggs", "pens", "stones", "cards", "shells"];

fn arithmetic_line(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 | 1 => {
            let (a, b) = (rng.range(0, 99), rng.range(0, 99));
            format!("{a} + {b} = {}.", a + b)
        }
        2 => {
            let (a, b) = (rng.range(0, 99), rng.range(0, 99));
            let (a, b) = (a.max(b), a.min(b));
            format!("{a} - {b} = {}.", a - b)
        }
        3 | 4 => {
            let (a, b) = (rng.range(0, 12), rng.range(0, 12));
            format!("{a} * {b} = {}.", a * b)
        }
        5 => {
            let (a, b) = (rng.range(1, 50), rng.range(1, 50));
            match rng.below(2) {
                0 => format!("What is {a} plus {b}? The answer is {}.", a + b),
                _ => format!("What is {} minus {b}? The answer is {a}.", a + b),
            }
        }
        6 => {
            let (a, b) = (rng.range(2, 12), rng.range(2, 12));
            format!("What is {a} times {b}? The answer is {}.", a * b)
        }
        _ => {
            let name = rng.pick(FIRST_NAMES);
            let item = rng.pick(ITEMS);
            let (a, b) = (rng.range(2, 40), rng.range(1, 20));
            match rng.below(3) {
                0 => format!("{name} has {a} {item} and gets {b} more. Now {name} has {a} + {b} = {} {item}.", a + b),
                1 => {
                    let (a, b) = (a.max(b), a.min(b));
                    format!("{name} has {a} {item} and gives away {b}. Now {name} has {a} - {b} = {} {item}.", a - b)
                }
                _ => {
                    let (a, b) = (a % 9 + 2, b % 9 + 2);
                    format!("{name} has {a} bags with {b} {item} in each. That is {a} * {b} = {} {item}.", a * b)
                }
            }
        }
    }
}

fn arithmetic_doc(rng: &mut Rng) -> String {
    let n = rng.range(3, 8);
    (0..n).map(|_| arithmetic_line(rng)).collect::<Vec<_>>().join("\n")
}

// ---------------------------------------------------------------------------------------
// Textbook

struct Concept {
    name: &'static str,
    plural: &'static str,
    kind: &'static str,
    /// Verb phrases true of every member ("has hair").
    properties: &'static [&'static str],
    /// Members, with their article where they need one ("the dog").
    examples: &'static [&'static str],
}

const fn c(
    name: &'static str,
    plural: &'static str,
    kind: &'static str,
    properties: &'static [&'static str],
    examples: &'static [&'static str],
) -> Concept {
    Concept { name, plural, kind, properties, examples }
}

const CONCEPTS: &[Concept] = &[
    c(
        "mammal",
        "mammals",
        "animal",
        &["has hair", "feeds its young with milk", "breathes air"],
        &["the dog", "the whale", "the bat", "the horse"],
    ),
    c(
        "bird",
        "birds",
        "animal",
        &["has feathers", "lays eggs", "has a beak"],
        &["the robin", "the eagle", "the penguin", "the owl"],
    ),
    c(
        "fish",
        "fish",
        "animal",
        &["lives in water", "breathes with gills", "has fins"],
        &["the salmon", "the shark", "the trout", "the cod"],
    ),
    c(
        "reptile",
        "reptiles",
        "animal",
        &["has scales", "lays eggs", "is cold blooded"],
        &["the snake", "the lizard", "the turtle", "the crocodile"],
    ),
    c(
        "insect",
        "insects",
        "animal",
        &["has six legs", "has three body parts", "has a hard outer shell"],
        &["the ant", "the bee", "the beetle", "the fly"],
    ),
    c(
        "planet",
        "planets",
        "object in space",
        &["orbits a star", "is round", "does not make its own light"],
        &["Mars", "Venus", "Earth", "Jupiter"],
    ),
    c(
        "star",
        "stars",
        "object in space",
        &["makes its own light", "is made of hot gas", "is very large"],
        &["the Sun", "Sirius", "Vega", "Polaris"],
    ),
    c(
        "metal",
        "metals",
        "material",
        &["conducts heat", "conducts electricity", "can be bent without breaking"],
        &["iron", "copper", "gold", "silver"],
    ),
    c(
        "gas",
        "gases",
        "state of matter",
        &["has no fixed shape", "has no fixed volume", "fills its container"],
        &["air", "steam", "helium", "oxygen"],
    ),
    c(
        "liquid",
        "liquids",
        "state of matter",
        &["has a fixed volume", "takes the shape of its container", "can flow"],
        &["water", "oil", "milk", "juice"],
    ),
    c(
        "solid",
        "solids",
        "state of matter",
        &["has a fixed shape", "has a fixed volume", "does not flow"],
        &["ice", "wood", "stone", "glass"],
    ),
    c(
        "plant",
        "plants",
        "living thing",
        &["makes its own food", "needs sunlight", "has roots"],
        &["the oak", "the fern", "the rose", "grass"],
    ),
    c(
        "triangle",
        "triangles",
        "shape",
        &["has three sides", "has three corners", "has angles that add up to 180 degrees"],
        &[],
    ),
    c(
        "square",
        "squares",
        "shape",
        &["has four equal sides", "has four right angles", "has two diagonals of equal length"],
        &[],
    ),
    c(
        "prime number",
        "prime numbers",
        "number",
        &["has exactly two factors", "is greater than one", "cannot be split into equal groups"],
        &["3", "5", "7", "11", "13"],
    ),
    c(
        "even number",
        "even numbers",
        "number",
        &["can be divided by two", "ends in 0, 2, 4, 6 or 8", "is the sum of two equal numbers"],
        &["4", "10", "28", "36"],
    ),
    c(
        "desert",
        "deserts",
        "region",
        &["gets very little rain", "has few plants", "can be very hot in the day"],
        &["the Sahara", "the Gobi"],
    ),
    c(
        "volcano",
        "volcanoes",
        "landform",
        &["is an opening in the crust of the earth", "can throw out lava and ash", "is often shaped like a cone"],
        &["Etna", "Fuji"],
    ),
];

/// (condition, effect): "when <condition>, <effect>".
const CAUSES: &[(&str, &str)] = &[
    ("ice is heated", "it melts into water"),
    ("water is heated to 100 degrees", "it boils and turns into steam"),
    ("water is cooled below 0 degrees", "it freezes into ice"),
    ("a metal is heated", "it expands"),
    ("a metal is cooled", "it contracts"),
    ("a plant gets no light", "it cannot make its food"),
    ("the sun sets", "the air becomes cooler"),
    ("clouds become heavy with water", "it rains"),
    ("a ball is dropped", "gravity pulls it to the ground"),
    ("two magnets face each other with the same poles", "they push each other away"),
    ("a circuit is closed", "electric current flows"),
    ("a circuit is opened", "the current stops"),
    ("salt is stirred into water", "it dissolves"),
    ("wood is burned", "it turns into ash and smoke"),
    ("the moon passes between the earth and the sun", "there is a solar eclipse"),
    ("a seed gets water and warmth", "it begins to grow"),
    ("air is heated", "it rises"),
    ("a force pushes an object", "the object speeds up"),
    ("a light shines on a mirror", "the light is reflected"),
    ("steam is cooled", "it condenses into water"),
];

fn definition(rng: &mut Rng, k: &Concept) -> String {
    let p = rng.pick(k.properties);
    match rng.below(3) {
        0 => format!("{} {} is {} {} that {p}.", capitalize(article(k.name)), k.name, article(k.kind), k.kind),
        1 => format!("We call {} {} that {p} {} {}.", article(k.kind), k.kind, article(k.name), k.name),
        _ => format!("{} {} is a kind of {}.", capitalize(article(k.name)), k.name, k.kind),
    }
}

fn cause_sentence(rng: &mut Rng) -> String {
    let (cond, eff) = rng.pick(CAUSES);
    match rng.below(3) {
        0 => format!("When {cond}, {eff}."),
        1 => format!("If {cond}, {eff}."),
        _ => format!("{} because {cond}.", capitalize(eff)),
    }
}

fn textbook_doc(rng: &mut Rng) -> String {
    let k = rng.pick(CONCEPTS);
    let mut s = vec![match rng.below(3) {
        0 => format!("In this lesson we learn about {}.", k.plural),
        1 => format!("This chapter is about {}.", k.plural),
        _ => format!("Let us study {}.", k.plural),
    }];
    s.push(definition(rng, k));
    let mut props: Vec<&str> = k.properties.to_vec();
    rng.shuffle(&mut props);
    match rng.below(3) {
        0 => s.push(format!("Every {} {}.", k.name, join_list(&props))),
        1 => {
            s.push(format!(
                "There are {} things to know about {}.",
                ["zero", "one", "two", "three"][props.len()],
                k.plural
            ));
            let ordinals = ["First", "Second", "Third"];
            for (o, p) in ordinals.iter().zip(&props) {
                s.push(format!("{o}, every {} {p}.", k.name));
            }
        }
        _ => {
            for p in &props[..2] {
                s.push(format!("{} {} {p}.", capitalize(article(k.name)), k.name));
            }
        }
    }
    if !k.examples.is_empty() {
        let n = rng.range(2, k.examples.len().min(4) as u32) as usize;
        let ex: Vec<&str> = rng.distinct(k.examples.len(), n).into_iter().map(|i| k.examples[i]).collect();
        s.push(match rng.below(2) {
            0 => format!("Examples of {} are {}.", k.plural, join_list(&ex)),
            _ => format!("{} is {} {}.", capitalize(ex[0]), article(k.name), k.name),
        });
    }
    // Two other concepts of the same kind give a contrast sentence.
    let others: Vec<&Concept> = CONCEPTS.iter().filter(|o| o.kind == k.kind && o.name != k.name).collect();
    if !others.is_empty() && rng.chance(1, 2) {
        let o = rng.pick(&others);
        s.push(format!("Unlike {} {}, {} {} {}.", article(o.name), o.name, article(k.name), k.name, props[0]));
    }
    for _ in 0..rng.range(1, 3) {
        s.push(cause_sentence(rng));
    }
    s.push(format!(
        "In short, {} {} is {} {} that {}.",
        article(k.name),
        k.name,
        article(k.kind),
        k.kind,
        props[props.len() - 1]
    ));
    s.join(" ")
}

// ---------------------------------------------------------------------------------------
// Multiple choice

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn split_of(text: &str) -> Split {
    if fnv1a(text).is_multiple_of(VALIDATION_MODULUS) { Split::Validation } else { Split::Train }
}

/// A rule question: it names its answer's position ("Which option comes after B?"),
/// so a small model learns it from reward alone, without the world's facts.
fn rule_candidate(rng: &mut Rng) -> (String, String, Vec<String>, Option<usize>) {
    let kind = rng.below(3);
    let at = match kind {
        0 => rng.below(3) + 1,
        1 => rng.below(3),
        _ => rng.below(4),
    };
    let words: Vec<String> = PROFESSIONS.iter().chain(PRODUCTS).map(|s| s.to_string()).collect();
    let gold = rng.pick(&words).clone();
    let question = match kind {
        0 => format!("Which option comes after {}?", McqRecord::letter(at - 1)),
        1 => format!("Which option comes before {}?", McqRecord::letter(at + 1)),
        _ => format!("Which option is {}?", McqRecord::letter(at)),
    };
    let wrong = words.into_iter().filter(|x| *x != gold).collect();
    (question, gold, wrong, Some(at))
}

/// A question with its gold answer, a pool of wrong answers (at least three, distinct)
/// and, for a question that names its answer's position, that position.
fn mcq_candidate(rng: &mut Rng, w: &World) -> (String, String, Vec<String>, Option<usize>) {
    let pool = |xs: Vec<String>, gold: &str| xs.into_iter().filter(|x| x != gold).collect::<Vec<_>>();
    let (question, gold, wrong) = match rng.below(14) {
        10..=12 => return rule_candidate(rng),
        13 => {
            let gold = rng.pick(COLORS).to_string();
            let words = PROFESSIONS.iter().chain(PRODUCTS).map(|s| s.to_string()).collect();
            (String::from("Which of these is a color?"), gold, words)
        }
        0 => {
            let c = &w.countries[rng.below(N_COUNTRIES)];
            let gold = w.towns[c.capital].name.clone();
            let wrong = pool(w.towns.iter().map(|t| t.name.clone()).collect(), &gold);
            (format!("What is the capital of {}?", c.name), gold, wrong)
        }
        1 => {
            let t = &w.towns[rng.below(N_TOWNS)];
            let gold = w.countries[t.country].name.clone();
            let wrong = pool(w.countries.iter().map(|c| c.name.clone()).collect(), &gold);
            (format!("In which country is the town of {}?", t.name), gold, wrong)
        }
        2 => {
            let t = &w.towns[rng.below(N_TOWNS)];
            let gold = t.founded.to_string();
            let wrong = pool(w.towns.iter().map(|t| t.founded.to_string()).collect(), &gold);
            (format!("In which year was {} founded?", t.name), gold, wrong)
        }
        3 => {
            let p = &w.people[rng.below(N_PEOPLE)];
            let gold = PROFESSIONS[p.profession].to_string();
            let wrong = pool(PROFESSIONS.iter().map(|s| s.to_string()).collect(), &gold);
            (format!("What does {} work as?", p.name), gold, wrong)
        }
        4 => {
            let p = &w.people[rng.below(N_PEOPLE)];
            let gold = w.towns[p.town].name.clone();
            let wrong = pool(w.towns.iter().map(|t| t.name.clone()).collect(), &gold);
            (format!("Where does {} live?", p.name), gold, wrong)
        }
        5 => {
            let e = &w.elements[rng.below(N_ELEMENTS)];
            let gold = COLORS[e.color].to_string();
            let wrong = pool(COLORS.iter().map(|s| s.to_string()).collect(), &gold);
            (format!("What is the color of {}?", e.name), gold, wrong)
        }
        6 | 7 => {
            let (q, gold) = match rng.below(3) {
                0 => {
                    let (a, b) = (rng.range(0, 99), rng.range(0, 99));
                    (format!("What is {a} + {b}?"), a + b)
                }
                1 => {
                    let (a, b) = (rng.range(0, 99), rng.range(0, 99));
                    let (a, b) = (a.max(b), a.min(b));
                    (format!("What is {a} - {b}?"), a - b)
                }
                _ => {
                    let (a, b) = (rng.range(2, 12), rng.range(2, 12));
                    (format!("What is {a} * {b}?"), a * b)
                }
            };
            let wrong = [1, 2, 10, 11, 9]
                .iter()
                .flat_map(|d| [gold + d, gold.wrapping_sub(*d)])
                .filter(|x| *x <= 300)
                .map(|x| x.to_string())
                .collect();
            (q, gold.to_string(), wrong)
        }
        8 => {
            let (cond, eff) = rng.pick(CAUSES);
            let gold = eff.to_string();
            let wrong = pool(CAUSES.iter().map(|(_, e)| e.to_string()).collect(), &gold);
            (format!("What happens when {cond}?"), gold, wrong)
        }
        _ => {
            let with_examples: Vec<&Concept> = CONCEPTS.iter().filter(|k| !k.examples.is_empty()).collect();
            let k = rng.pick(&with_examples);
            let gold = rng.pick(k.examples).to_string();
            let wrong = CONCEPTS
                .iter()
                .filter(|o| o.name != k.name)
                .flat_map(|o| o.examples.iter().map(|e| e.to_string()))
                .filter(|e| !k.examples.contains(&e.as_str()))
                .collect();
            (format!("Which of these is {} {}?", article(k.name), k.name), capitalize(&gold), wrong)
        }
    };
    (question, gold, wrong, None)
}

fn mcq_record(rng: &mut Rng, w: &World, split: Split, rules_only: bool) -> McqRecord {
    loop {
        let (question, gold, mut wrong, at) = if rules_only { rule_candidate(rng) } else { mcq_candidate(rng, w) };
        if split_of(&format!("{question}\n{gold}")) != split {
            continue;
        }
        wrong.sort();
        wrong.dedup();
        let picks = rng.distinct(wrong.len(), 3);
        let answer = at.unwrap_or_else(|| rng.below(4));
        let mut others = picks.into_iter().map(|i| capitalize_like(&wrong[i], &gold));
        let options =
            std::array::from_fn(|i| if i == answer { gold.clone() } else { others.next().expect("three distractors") });
        return McqRecord { question, options, answer };
    }
}

/// Distractors take the gold answer's capitalisation, so case gives nothing away.
fn capitalize_like(s: &str, gold: &str) -> String {
    if gold.starts_with(char::is_uppercase) { capitalize(s) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    fn head_hash(source: &str) -> String {
        let docs = documents(source, 0, Split::Train, 4096).unwrap();
        let joined = docs.join("\n\u{0}");
        let hex: String = Sha256::digest(&joined.as_bytes()[..4096]).iter().map(|b| format!("{b:02x}")).collect();
        hex[..16].to_string()
    }

    #[test]
    fn pinned_output() {
        // Changing a generator changes these: bump CORPUS_VERSION, then update them.
        let got: Vec<(&str, String)> = SOURCES.iter().map(|s| (*s, head_hash(s))).collect();
        let want = [
            ("textbook", "0d9dc09c4b064aee"),
            ("facts", "bd2ec585162c754b"),
            ("arithmetic", "3a997764dabad000"),
            ("mcq", "b4d6f890ec4f1785"),
        ]
        .map(|(s, h)| (s, h.to_string()));
        assert_eq!(got, want, "the corpus output changed");
    }

    #[test]
    #[ignore = "prints sample documents: cargo test -p trainer --lib show_samples -- --ignored --nocapture"]
    fn show_samples() {
        for s in SOURCES {
            for d in documents(s, 0, Split::Train, 1500).unwrap() {
                println!("[{s}] {d}\n");
            }
        }
    }

    #[test]
    fn deterministic_and_prefix_stable() {
        for s in SOURCES {
            let a = documents(s, 7, Split::Train, 20_000).unwrap();
            let b = documents(s, 7, Split::Train, 40_000).unwrap();
            assert!(a.iter().map(String::len).sum::<usize>() >= 20_000);
            assert_eq!(a[..], b[..a.len()], "{s}");
        }
    }

    #[test]
    fn splits_and_seeds_differ() {
        for s in SOURCES {
            let train: BTreeSet<String> = documents(s, 0, Split::Train, 50_000).unwrap().into_iter().collect();
            let val = documents(s, 0, Split::Validation, 50_000).unwrap();
            let other_seed = documents(s, 1, Split::Train, 5_000).unwrap();
            assert_ne!(other_seed[..], documents(s, 0, Split::Train, 5_000).unwrap()[..], "{s}");
            assert!(val.iter().all(|d| !train.contains(d)), "{s}: a validation document is in train");
        }
        let key = |r: &McqRecord| format!("{}\n{}", r.question, r.options[r.answer]);
        let train: BTreeSet<String> = mcq_records(0, 2000, Split::Train).iter().map(key).collect();
        let val = mcq_records(0, 500, Split::Validation);
        assert!(val.iter().all(|r| !train.contains(&key(r)) && r.split() == Split::Validation));
    }

    #[test]
    fn unknown_source_names_it_and_the_valid_ones() {
        let e = documents("poems", 0, Split::Train, 10).unwrap_err().to_string();
        assert!(e.contains("poems") && SOURCES.iter().all(|s| e.contains(s)), "{e}");
    }

    /// Rule questions name their answer's position, and every position occurs.
    #[test]
    fn rule_questions_answer_the_position_they_name() {
        let mut seen = [0; 4];
        for r in mcq_rule_records(2, 600, Split::Train) {
            let named = (r.question.as_bytes()[r.question.len() - 2] - b'A') as usize;
            let want = if r.question.contains("after") {
                named + 1
            } else if r.question.contains("before") {
                named - 1
            } else {
                named
            };
            assert_eq!(r.answer, want, "{}", r.text());
            seen[r.answer] += 1;
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
        let val = mcq_rule_records(2, 50, Split::Validation);
        assert!(val.iter().all(|r| r.split() == Split::Validation));
    }

    #[test]
    fn mcq_format_answers_and_letters() {
        let recs = mcq_records(3, 4000, Split::Train);
        let mut per_letter = [0usize; 4];
        for r in &recs {
            per_letter[r.answer] += 1;
            let distinct: BTreeSet<&String> = r.options.iter().collect();
            assert_eq!(distinct.len(), 4, "{r:?}");
            let text = r.text();
            assert!(
                text.starts_with("Question: ") && text.ends_with(&format!("\nAnswer: {}", McqRecord::letter(r.answer)))
            );
            assert_eq!(text.lines().count(), 6);
            assert_eq!(&text[..r.prompt().len()], r.prompt());
            // Arithmetic answers are right.
            let expr = r.question.strip_prefix("What is ").and_then(|q| q.strip_suffix('?')).unwrap_or("");
            let t: Vec<&str> = expr.split(' ').collect();
            if let [a, _, b] = t[..]
                && let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>())
            {
                let v = match t[1] {
                    "+" => a + b,
                    "-" => a - b,
                    _ => a * b,
                };
                assert_eq!(r.options[r.answer], v.to_string(), "{r:?}");
            }
        }
        for n in per_letter {
            assert!((900..1100).contains(&n), "{per_letter:?}");
        }
        // The documents are the records' text.
        let docs = documents("mcq", 3, Split::Train, 2000).unwrap();
        assert_eq!(docs[0], recs[0].text());
        assert_eq!(docs[1], recs[1].text());
    }

    #[test]
    fn arithmetic_statements_are_correct() {
        for doc in documents("arithmetic", 5, Split::Train, 100_000).unwrap() {
            for line in doc.lines() {
                // Every "a op b = c" in the text holds.
                let t: Vec<&str> = line.split(' ').collect();
                for i in 0..t.len().saturating_sub(4) {
                    if t[i + 3] != "=" {
                        continue;
                    }
                    let num = |s: &str| s.trim_end_matches('.').parse::<i64>().unwrap();
                    let (a, b, c) = (num(t[i]), num(t[i + 2]), num(t[i + 4]));
                    let v = match t[i + 1] {
                        "+" => a + b,
                        "-" => a - b,
                        "*" => a * b,
                        op => panic!("operator {op} in {line}"),
                    };
                    assert_eq!(v, c, "{line}");
                }
            }
        }
    }

    #[test]
    fn facts_are_consistent() {
        // Every statement of a town's founding year agrees with every other.
        let mut years = std::collections::BTreeMap::new();
        for doc in documents("facts", 11, Split::Train, 200_000).unwrap() {
            for sent in doc.split(". ") {
                if let Some((town, year)) =
                    sent.split_once(" was founded in the year ").or_else(|| sent.split_once(" was founded in "))
                {
                    let year = year.split([' ', '.']).next().unwrap().to_string();
                    if town == "It" {
                        continue;
                    }
                    if let Some(prev) = years.insert(town.to_string(), year.clone()) {
                        assert_eq!(prev, year, "{town}");
                    }
                }
            }
        }
        assert!(years.len() >= N_TOWNS, "{years:?}");
    }
}
