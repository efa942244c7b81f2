//! Tokenizers: the embedded byte-level BPE, trained on the embedded corpus and cached on
//! disk, or a Hugging Face `tokenizer.json` loaded from a path.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};

use sha2::{Digest, Sha256};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder};

use super::corpus::{self, CORPUS_VERSION, SOURCES, Split};
use crate::Error;

/// The end-of-text token; id 0 in the embedded tokenizer.
pub const EOS: &str = "<|endoftext|>";

/// End-of-text tokens recognised in tokenizer files, in order of preference.
const EOS_CANDIDATES: &[&str] = &[EOS, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"];

/// The embedded tokenizer's training sample: this many bytes of the train split of each
/// source, from seed 0.
const SAMPLE_BYTES_PER_SOURCE: usize = 512 * 1024;

/// A tokenizer with its end-of-text id and a content hash.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: u32,
    hash: String,
    origin: String,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("origin", &self.origin).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// The embedded byte-level BPE (vocabulary `crds::presets::EMBEDDED_VOCAB_SIZE`, EOS
    /// at id 0), from the cache under [`super::cache_dir`] or trained and cached there.
    pub fn embedded() -> Result<Self, Error> {
        Self::embedded_in(&super::cache_dir())
    }

    /// [`Tokenizer::embedded`] with an explicit cache directory. A cache file that does
    /// not load is replaced, with a warning.
    pub fn embedded_in(cache_dir: &Path) -> Result<Self, Error> {
        let vocab = crds::presets::EMBEDDED_VOCAB_SIZE as usize;
        let path = embedded_cache_path(cache_dir, vocab);
        if path.exists() {
            match Self::from_file(&path).and_then(|t| t.check_embedded(vocab).map(|()| t)) {
                Ok(t) => return Ok(t),
                Err(e) => tracing::warn!("discarding the cached embedded tokenizer ({e}); training it again"),
            }
        }
        let start = std::time::Instant::now();
        let json = train_embedded(vocab, SAMPLE_BYTES_PER_SOURCE)?;
        tracing::info!(seconds = start.elapsed().as_secs_f64(), "trained the embedded tokenizer");
        if let Err(e) = crate::files::write_atomic(&path, json.as_bytes()) {
            tracing::warn!("could not cache the embedded tokenizer at {}: {e}", path.display());
        }
        let t = Self::from_json(&json, "embedded")?;
        t.check_embedded(vocab)?;
        Ok(t)
    }

    /// Loads a Hugging Face `tokenizer.json`. Its end-of-text token is the first of
    /// `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>`, `<|im_end|>` it defines.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let json = crate::files::read_text_capped(path, crate::files::limits::TOKENIZER_BYTES)
            .map_err(|e| Error::Tokenizer { path: path.display().to_string(), message: e.to_string() })?;
        Self::from_json(&json, &path.display().to_string())
    }

    /// A `tokenizer.json`'s text; errors name `origin`.
    pub fn from_json(json: &str, origin: &str) -> Result<Self, Error> {
        let err = |message: String| Error::Tokenizer { path: origin.to_string(), message };
        let mut inner: tokenizers::Tokenizer = json.parse().map_err(|e| err(format!("not a tokenizer.json: {e}")))?;
        // Documents are concatenated into a stream: a file's truncation or padding settings
        // would silently cut or pad them.
        inner.with_truncation(None).map_err(|e| err(e.to_string()))?;
        inner.with_padding(None);
        let eos = EOS_CANDIDATES
            .iter()
            .find_map(|t| inner.token_to_id(t))
            .ok_or_else(|| err(format!("defines none of the end-of-text tokens {}", EOS_CANDIDATES.join(" "))))?;
        let canonical = inner.to_string(false).map_err(|e| err(e.to_string()))?;
        let hash = super::hex(&Sha256::digest(canonical.as_bytes()));
        inner.encode_fast("Hello, world 123.", false).map_err(|e| err(format!("cannot encode text: {e}")))?;
        Ok(Tokenizer { inner, eos, hash, origin: origin.to_string() })
    }

    fn check_embedded(&self, vocab: usize) -> Result<(), Error> {
        if self.eos != 0 || self.vocab_size() > vocab || self.vocab_size() < 257 {
            return Err(Error::Tokenizer {
                path: self.origin.clone(),
                message: format!(
                    "expected EOS at id 0 and at most {vocab} tokens, found EOS {} and {} tokens",
                    self.eos,
                    self.vocab_size()
                ),
            });
        }
        Ok(())
    }

    /// Token ids of `text`, without special tokens added. Panics if the model rejects the
    /// text (byte-level BPE accepts every string).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        // Loading checked that this tokenizer encodes; byte-level models accept any string,
        // and a model that rejects some text is a bug to surface, not to paper over.
        match self.inner.encode_fast(text, false) {
            Ok(e) => e.get_ids().to_vec(),
            Err(e) => panic!("tokenizer {} cannot encode {text:?}: {e}", self.origin),
        }
    }

    /// [`Tokenizer::encode`] of many texts, in parallel on all cores.
    pub fn encode_batch(&self, texts: &[String]) -> Vec<Vec<u32>> {
        let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
        match self.inner.encode_batch_fast(inputs, false) {
            Ok(encodings) => encodings.into_iter().map(|e| e.get_ids().to_vec()).collect(),
            Err(_) => texts.iter().map(|t| self.encode(t)).collect(),
        }
    }

    /// [`Tokenizer::encode`] of each text of `items`, on all cores, handing each text's
    /// ids to `each` in the order of `items`. Unlike batches of [`Tokenizer::encode_batch`],
    /// which each last as long as their longest text, texts are encoded as they come while up
    /// to `window_bytes` of them wait for `each`: one long document keeps one core, not the
    /// stream. The first error of `each` stops the stream and is returned, after the texts in
    /// flight are encoded. Call it from outside the rayon pool: it blocks on its tasks.
    pub fn encode_in_order<T, E>(
        &self,
        items: impl IntoIterator<Item = (String, T)>,
        window_bytes: usize,
        mut each: impl FnMut(T, Vec<u32>) -> Result<(), E>,
    ) -> Result<(), E> {
        struct Pending<T> {
            ids: Receiver<Vec<u32>>,
            bytes: usize,
            item: T,
        }
        let next = |p: Pending<T>| {
            // A sender dropped unsent is a task that panicked: the scope rethrows its panic.
            let ids = p.ids.recv().unwrap_or_else(|_| panic!("tokenizer {}: an encoding task panicked", self.origin));
            (p.item, ids)
        };
        rayon::in_place_scope(|scope| {
            let mut pending = VecDeque::new();
            let mut in_flight = 0;
            for (text, item) in items {
                let (tx, ids) = sync_channel(1);
                let bytes = text.len();
                scope.spawn(move |_| {
                    let _ = tx.send(self.encode(&text));
                });
                pending.push_back(Pending { ids, bytes, item });
                in_flight += bytes;
                while in_flight > window_bytes
                    && let Some(p) = pending.pop_front()
                {
                    in_flight -= p.bytes;
                    let (item, ids) = next(p);
                    each(item, ids)?;
                }
            }
            pending.into_iter().try_for_each(|p| {
                let (item, ids) = next(p);
                each(item, ids)
            })
        })
    }

    /// The text of `ids`; special tokens are kept (the end of text shows as `<|endoftext|>`).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_else(|e| format!("<cannot decode: {e}>"))
    }

    /// The end-of-text token id (0 for the embedded tokenizer).
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// The end-of-text token's text, e.g. `<|endoftext|>`.
    pub fn eos_token(&self) -> String {
        self.inner.id_to_token(self.eos).unwrap_or_else(|| EOS.to_string())
    }

    /// Number of tokens, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// SHA-256 (hex) of the tokenizer's canonical JSON: equal hashes, equal tokenizers.
    pub fn hash(&self) -> String {
        self.hash.clone()
    }

    /// The tokenizer as `tokenizer.json` text (to store beside checkpoints).
    pub fn to_json(&self) -> Result<String, Error> {
        self.inner.to_string(false).map_err(|e| Error::Tokenizer { path: self.origin.clone(), message: e.to_string() })
    }
}

/// Where the embedded tokenizer is cached: keyed by the corpus version, the vocabulary
/// size and the training sample.
fn embedded_cache_path(cache_dir: &Path, vocab: usize) -> PathBuf {
    let key = format!("corpus-v{CORPUS_VERSION}/vocab-{vocab}/sample-{SAMPLE_BYTES_PER_SOURCE}/eos-{EOS}");
    let key = super::hex(&Sha256::digest(key.as_bytes()));
    cache_dir.join("tokenizers").join(format!("embedded-{}", &key[..16])).join("tokenizer.json")
}

/// Trains the byte-level BPE on `sample_bytes` of each source's train split and returns
/// its JSON.
fn train_embedded(vocab: usize, sample_bytes: usize) -> Result<String, Error> {
    let mut docs = Vec::new();
    for source in SOURCES {
        docs.extend(corpus::documents(source, 0, Split::Train, sample_bytes)?);
    }
    train_bpe_json(docs.iter(), vocab, "embedded")
}

/// Trains a byte-level BPE of `vocab` tokens (EOS first, at id 0) on `docs` and returns
/// its JSON. Deterministic: the word counts are summed, pair ids come from the sorted
/// byte alphabet and merge ties break by pair id, so hash-map order does not matter.
pub fn train_bpe_json<I, S>(docs: I, vocab: usize, origin: &str) -> Result<String, Error>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    let err = |message: String| Error::Tokenizer { path: origin.to_string(), message };
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOS, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tok = TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()))
        .build()
        .map_err(|e| err(e.to_string()))?;
    tok.train(&mut trainer, docs).map_err(|e| err(format!("training failed: {e}")))?;
    tok.to_string(false).map_err(|e| err(e.to_string()))
}

impl Tokenizer {
    /// [`train_bpe_json`], loaded.
    pub fn train_bpe<I, S>(docs: I, vocab: usize, origin: &str) -> Result<Tokenizer, Error>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        Self::from_json(&train_bpe_json(docs, vocab, origin)?, origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_util::TempDir;

    #[test]
    fn a_huge_tokenizer_file_is_refused_before_it_is_read() {
        let dir = TempDir::new("tok-bomb");
        let path = dir.0.join("tokenizer.json");
        std::fs::File::create(&path).unwrap().set_len(1 << 40).unwrap();
        let e = Tokenizer::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("tokenizer.json") && e.contains("1099511627776 bytes, more than the 268435456"), "{e}");
    }

    #[test]
    fn encode_in_order_hands_over_each_texts_ids_in_order_and_stops_at_the_first_error() {
        let t = Tokenizer::from_json(&train_embedded(600, 64 * 1024).unwrap(), "test").unwrap();
        // Long texts among short ones: with a window, a short text behind a long one is
        // encoded first and must still wait its turn.
        let texts: Vec<String> = (0..200)
            .map(|i| {
                let words = if i % 17 == 0 { 20_000 } else { 1 + i % 7 };
                (0..words).map(|w| format!("word{} ", (i * 31 + w) % 97)).collect()
            })
            .collect();
        let want: Vec<Vec<u32>> = texts.iter().map(|x| t.encode(x)).collect();
        for window_bytes in [0, 1 << 10, 64 << 20] {
            let mut got = Vec::new();
            let items = texts.iter().cloned().enumerate().map(|(i, x)| (x, i));
            t.encode_in_order(items, window_bytes, |i, ids| {
                got.push((i, ids));
                Ok::<(), ()>(())
            })
            .unwrap();
            let order: Vec<usize> = got.iter().map(|(i, _)| *i).collect();
            assert_eq!(order, (0..texts.len()).collect::<Vec<_>>(), "window {window_bytes}");
            assert!(got.into_iter().map(|(_, ids)| ids).eq(want.iter().cloned()), "window {window_bytes}");
        }
        let mut seen = Vec::new();
        let items = texts.iter().cloned().enumerate().map(|(i, x)| (x, i));
        let stopped = t.encode_in_order(items, 1 << 10, |i, _| {
            seen.push(i);
            if i == 40 { Err(format!("stop at {i}")) } else { Ok(()) }
        });
        assert_eq!(stopped, Err("stop at 40".to_string()));
        assert_eq!(seen, (0..=40).collect::<Vec<_>>(), "nothing after the error");
    }

    #[test]
    fn training_is_deterministic() {
        let a = train_embedded(600, 64 * 1024).unwrap();
        let b = train_embedded(600, 64 * 1024).unwrap();
        assert!(a == b, "two trainings on the same sample differ");
        let t = Tokenizer::from_json(&a, "test").unwrap();
        assert_eq!((t.eos_id(), t.vocab_size()), (0, 600));
    }

    #[test]
    fn embedded_roundtrip_cache_and_corrupt_cache() {
        let dir = TempDir::new("tok");
        let start = std::time::Instant::now();
        let t = Tokenizer::embedded_in(&dir.0).unwrap();
        eprintln!("embedded tokenizer ({} tokens) trained in {:.2?}", t.vocab_size(), start.elapsed());
        assert_eq!(t.eos_id(), 0);
        // The corpus saturates below the model's vocabulary: every word becomes one token.
        let vocab = t.vocab_size();
        assert!((1024..=crds::presets::EMBEDDED_VOCAB_SIZE as usize).contains(&vocab), "{vocab} tokens");
        for text in ["Question: What is 7 * 8?\nA. 56\nAnswer: A", "Belmora was founded in 1432. ünïcödé ✓", ""] {
            assert_eq!(t.decode(&t.encode(text)), text);
        }
        assert_eq!(t.decode(&[0]), EOS);
        // Common corpus words are single tokens.
        assert_eq!(t.encode(" the").len(), 1);

        let path = embedded_cache_path(&dir.0, crds::presets::EMBEDDED_VOCAB_SIZE as usize);
        let cached = Tokenizer::embedded_in(&dir.0).unwrap();
        assert_eq!(cached.hash(), t.hash());
        assert_eq!(cached.hash(), Tokenizer::from_file(&path).unwrap().hash());

        std::fs::write(&path, "{ not json").unwrap();
        let retrained = Tokenizer::embedded_in(&dir.0).unwrap();
        assert_eq!(retrained.hash(), t.hash());
        assert_eq!(Tokenizer::from_file(&path).unwrap().hash(), t.hash());
    }

    #[test]
    fn from_file_errors_name_the_file() {
        let dir = TempDir::new("tokerr");
        let missing = dir.0.join("missing.json");
        let e = Tokenizer::from_file(&missing).unwrap_err().to_string();
        assert!(e.contains("missing.json"), "{e}");
        let bad = dir.0.join("bad.json");
        std::fs::write(&bad, "[]").unwrap();
        let e = Tokenizer::from_file(&bad).unwrap_err();
        assert!(e.to_string().contains("bad.json"), "{e}");
        assert_eq!(e.reason(), Some(crds::contract::FailureReason::DataError));
    }
}
