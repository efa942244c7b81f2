//! Textbook paragraphs: definitions of concepts and cause-effect sentences.

use super::rng::{Rng, article, capitalize, join_list};

pub(super) struct Concept {
    pub(super) name: &'static str,
    pub(super) plural: &'static str,
    pub(super) kind: &'static str,
    /// Verb phrases true of every member ("has hair").
    pub(super) properties: &'static [&'static str],
    /// Members, with their article where they need one ("the dog").
    pub(super) examples: &'static [&'static str],
}

pub(super) const fn c(
    name: &'static str,
    plural: &'static str,
    kind: &'static str,
    properties: &'static [&'static str],
    examples: &'static [&'static str],
) -> Concept {
    Concept { name, plural, kind, properties, examples }
}

pub(super) const CONCEPTS: &[Concept] = &[
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
pub(super) const CAUSES: &[(&str, &str)] = &[
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

pub(super) fn definition(rng: &mut Rng, k: &Concept) -> String {
    let p = rng.pick(k.properties);
    match rng.below(3) {
        0 => format!("{} {} is {} {} that {p}.", capitalize(article(k.name)), k.name, article(k.kind), k.kind),
        1 => format!("We call {} {} that {p} {} {}.", article(k.kind), k.kind, article(k.name), k.name),
        _ => format!("{} {} is a kind of {}.", capitalize(article(k.name)), k.name, k.kind),
    }
}

pub(super) fn cause_sentence(rng: &mut Rng) -> String {
    let (cond, eff) = rng.pick(CAUSES);
    match rng.below(3) {
        0 => format!("When {cond}, {eff}."),
        1 => format!("If {cond}, {eff}."),
        _ => format!("{} because {cond}.", capitalize(eff)),
    }
}

pub(super) fn textbook_doc(rng: &mut Rng) -> String {
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
