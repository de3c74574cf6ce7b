// make_corpus.mjs: writes the tokenizer test corpus to stdout, one JSON string per line.
// Deterministic (seeded PRNG, no Date/Math.random), so the same 3,000 strings come out on every
// machine. Hand-written edge cases first, then random mixtures of fragments from many scripts,
// emoji sequences, decomposed characters, exotic whitespace, code, numbers and special tokens,
// then strings of random code points drawn from many Unicode blocks.
// Characters are kept to Unicode <= 13 so that utf8proc / PCRE2 / node agree on their properties.
//
// usage: node make_corpus.mjs > corpus.jsonl

let seed = 0x5eed1234;
function rand() { // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const rint = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const scripts = {
  latin: ["café", "naïve", "Ångström", "Zürich", "façade", "jalapeño", "crème brûlée", "Øresund",
          "São Paulo", "Łódź", "İstanbul", "straße", "ÆSIR", "œuvre", "Dvořák", "ĳssel", "ﬁnance"],
  english: ["The quick brown fox jumps over the lazy dog.", "Hello, world!", "I'm", "you're",
            "they've", "she'll", "it's", "DON'T", "We'D", "rock'n'roll", "e-mail", "U.S.A.",
            "state-of-the-art", "don’t", "Mr. Smith", "(parenthetical)", "quote \"this\"",
            "THE END", "lowercase", "camelCaseWord", "snake_case_word", "KEBAB-CASE"],
  cyrillic: ["Привет мир", "съешь же ещё этих мягких французских булок", "Ёлка", "ПРОПИСНЫЕ",
             "україна", "Беларусь", "српски"],
  greek: ["Καλημέρα κόσμε", "ΑΒΓΔ αβγδ", "τελικός ς", "Ἀθῆναι", "ΐΰ"],
  arabic: ["مرحبا بالعالم", "مَرْحَبًا", "العربية", "١٢٣٤٥", "ﻻ", "كتاب‌ها"],
  hebrew: ["שלום עולם", "שָׁלוֹם", "עִבְרִית", "ירושלים"],
  devanagari: ["नमस्ते दुनिया", "क्षत्रिय", "हिन्दी", "१२३", "श्री"],
  thai: ["สวัสดีชาวโลก", "ภาษาไทย", "กรุงเทพมหานคร"],
  cjk: ["你好世界", "日本語のテキスト", "漢字かなカナ", "中文，标点。", "「引用」", "ｆｕｌｌｗｉｄｔｈ", "１２３",
        "𠀀𠀁", "龍"],
  hangul: ["안녕하세요 세계", "한국어", "\u1100\u1161\u11A8", "\u1112\u1161\u11AB\u1100\u1173\u11AF"],
  other: ["Բարեւ", "გამარჯობა", "வணக்கம்", "হ্যালো", "ሰላም", "བཀྲ་ཤིས", "ಕನ್ನಡ", "ᚠᚢᚦ", "Ⲁⲃ",
          "ꦗꦮ", "ᐊᐃᐅ", "Ελλάδα", "ꙮ"],
  emoji: ["🤗", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "🏳️‍🌈", "❤️", "🧑🏿‍💻", "1️⃣", "👩🏻‍❤️‍💋‍👨🏼",
          "😀😃😄", "✨", "🚀", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☺︎", "🧔‍♀️"],
  decomposed: ["e\u0301", "a\u0308", "n\u0303", "A\u030A", "o\u0302\u0323", "u\u0308\u0301",
               "\u0301", "Cafe\u0301", "i\u0307", "\u0041\u0300\u0316", "\u1E9B\u0323"],
  space: [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\r", " \n ", "\u00A0", "\u2009",
          "\u3000", "\u2028", "\u2029", "\u0085", "\u200B", "\uFEFF", "\u1680", "\u202F", "\u205F",
          "\u000B", "\u000C", " \u00A0 ", "\u2003\u2002", "\u180E"],
  code: ["int main(void) { return 0; }", "def f(x):\n    return x ** 2\n",
         "for (let i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "fn main() { println!(\"hi\"); }",
         "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">&amp;</div>", "{\"key\": [1, 2, null]}",
         "#include <stdio.h>", "x = y if z else w  # comment", "$ ls -la | grep foo > /dev/null 2>&1",
         "    indented\n        more", "a+=b;c-=d;e*=f;", "/* block */ // line", "std::vector<int> v;",
         "`backticks` and ~tilde~", "\\n\\t\\\\", "@decorator\nclass A(B):\n    pass"],
  numbers: ["0", "7", "42", "123456789", "3.14159", "1,000,000", "0x1F", "1e-9", "-273.15", "²³",
            "½", "Ⅻ", "٣٤٥", "१२३", "１２３", "12:30", "2024-01-01", "+1 (555) 123-4567", "99.9%"],
  special: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|im_sta",
            "<|im_start|", "<|im_start|>>", "<<|im_end|>", "<tool_call>", "</tool_call>",
            "<|fim_prefix|>", "<|vision_pad|>", "<|endoftext|><|endoftext|>", "< think>", "<THINK>"],
  punct: ["!", "?", "...", "—", "–", "“quoted”", "«guillemets»", "¿Qué?", "¡Hola!", "…", "§", "©®™",
          "•", "→", "∑∫√", "@#$%^&*", "'s", "'S", "'ll", "'LL", "'Re", "'ſ", "'\u212A", "''", "'"],
  // no U+0000: JSON-lines inputs refuse NUL characters (one rule for every command); the
  // tokenizer's own handling of NUL bytes is checked in test_tokenizer.c and fuzz_tokenizer.c
  control: ["\u0002", "\u0001", "\u001B[31m", "\u007F", "\u0008"],
};

const out = [];
const add = (s) => out.push(s);

// 1. hand-written edge cases
for (const pool of Object.values(scripts)) for (const s of pool) add(s);
add("");
add("a".repeat(5000));
add(" ".repeat(3000));
add("\n".repeat(1000));
add("ab".repeat(2000));
add("🤗".repeat(500));
add("a\u0301".repeat(300));
add("1".repeat(1000));
add("x" + " ".repeat(50) + "y");
add("   leading spaces");
add("trailing spaces   ");
add(" \t\n mixed \r\n\t ");
add("word\u00A0word\u2009word\u3000word");
add("Supercalifragilisticexpialidocious".repeat(20));
add("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n");
add("<think>\nreasoning...\n</think>\n\nanswer");
add("text<|endoftext|>more text<|im_end|>");
add("https://example.com/path?query=1&x=y#frag");
add("user@example.com");
add("C:\\Program Files\\app.exe");
add("...---...");
add("The year 2024 had 366 days.");
add("ÀÁÂÃÄÅàáâãäå");
add("\uD83D\uDC4D".repeat(3));
add("한국어\u1100\u1161 mixed 日本語 and English");

// 2. random mixtures
const pools = Object.keys(scripts);
const seps = ["", " ", " ", " ", "  ", "\n", "\t", "\r\n", ", ", ". ", "\u00A0", "\u3000"];
while (out.length < 2400) {
  const n = rint(1, 12);
  let s = "";
  for (let i = 0; i < n; i++) {
    const kind = pick(pools);
    let frag = pick(scripts[kind]);
    if (rand() < 0.1) frag = frag.toUpperCase();
    if (rand() < 0.05) frag = frag.repeat(rint(2, 40));
    s += frag + pick(seps);
  }
  if (rand() < 0.1) s = " " + s;
  if (rand() < 0.05) s = s.trimEnd();
  add(s);
}
// 3. random code points from many blocks (combining marks, jamo, emoji modifiers, exotic spaces)
const ranges = [[0x20, 0x7e], [0x9, 0xd], [0xa0, 0x17f], [0x300, 0x36f], [0x370, 0x3ff], [0x400, 0x4ff],
                [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff],
                [0x2000, 0x206f], [0x3000, 0x30ff], [0x4e00, 0x4fff], [0xac00, 0xad00], [0x1f300, 0x1f64f],
                [0x1f3fb, 0x1f3ff], [0x200d, 0x200d], [0xfe0f, 0xfe0f], [0x1f1e6, 0x1f1ff], [0xff00, 0xffef],
                [0x85, 0x85], [0x2028, 0x2029]];
while (out.length < 3000) {
  let s = "";
  for (let i = rint(1, 40); i > 0; i--) {
    if (rand() < 0.03) { s += pick(scripts.special); continue; }
    const r = pick(ranges);
    s += String.fromCodePoint(rint(r[0], r[1]));
    if (rand() < 0.2) s += " ";
  }
  add(s);
}
for (const s of out) process.stdout.write(JSON.stringify(s) + "\n");
