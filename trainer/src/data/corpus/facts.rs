//! The facts world: a fixed synthetic world of countries, towns, people, elements
//! and rivers, and documents stating its facts.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use super::rng::{Rng, article, capitalize, join_list};

/// Seed of the fixed synthetic world that `facts` and `mcq` talk about. It is not the
/// run seed: every run, split and tokenizer sees the same world.
const WORLD_SEED: u64 = 0x05ee_d0f7_ac75;

pub(super) const COLORS: &[&str] = &["red", "blue", "green", "yellow", "white", "black", "orange", "purple"];
pub(super) const PROFESSIONS: &[&str] = &[
    "baker", "painter", "sailor", "doctor", "teacher", "farmer", "miner", "weaver", "builder", "singer", "judge",
    "chemist",
];
pub(super) const PRODUCTS: &[&str] =
    &["glass", "wool", "cheese", "clocks", "paper", "salt", "wine", "silk", "boats", "bells", "honey", "tea"];
pub(super) const STATES: &[&str] = &["solid", "liquid", "gas"];
pub(super) const FIRST_NAMES: &[&str] = &[
    "Ada", "Bruno", "Clara", "Dario", "Elena", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Leo", "Mara",
    "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Umar", "Vera", "Walt", "Yara", "Zeno",
];
pub(super) const SYLLABLES: &[&str] = &[
    "bel", "mor", "tov", "rin", "kas", "dal", "vel", "nor", "sa", "lin", "gar", "ost", "mi", "fen", "tal", "bri",
    "cor", "dun", "el", "han", "qua", "zer", "pol", "ves",
];

pub(super) const N_COUNTRIES: usize = 6;
pub(super) const N_TOWNS: usize = 24;
pub(super) const N_PEOPLE: usize = 36;
pub(super) const N_ELEMENTS: usize = 12;
pub(super) const N_RIVERS: usize = 8;

pub(super) struct Country {
    pub(super) name: String,
    pub(super) language: String,
    pub(super) capital: usize,
}

pub(super) struct Town {
    pub(super) name: String,
    pub(super) country: usize,
    pub(super) founded: u32,
    pub(super) river: usize,
    pub(super) product: usize,
}

pub(super) struct Person {
    pub(super) name: String,
    pub(super) town: usize,
    pub(super) profession: usize,
    pub(super) color: usize,
    pub(super) born: u32,
}

pub(super) struct Element {
    pub(super) name: String,
    pub(super) color: usize,
    pub(super) state: usize,
    pub(super) discoverer: usize,
    pub(super) year: u32,
}

pub(super) struct World {
    pub(super) countries: Vec<Country>,
    pub(super) towns: Vec<Town>,
    pub(super) people: Vec<Person>,
    pub(super) elements: Vec<Element>,
    pub(super) rivers: Vec<String>,
}

pub(super) fn world() -> &'static World {
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

pub(super) fn facts_doc(rng: &mut Rng, w: &World) -> String {
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
