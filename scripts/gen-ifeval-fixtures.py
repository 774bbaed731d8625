#!/usr/bin/env python3
"""Builds tests/fixtures/rewards/ifeval/cases.jsonl: IFEval (instruction ids, kwargs, response)
cases with the verdicts of lm-eval's IFEval implementation (lm_eval.tasks.ifeval), strict and loose.

Every one of the 25 instruction types gets >= 8 single-instruction cases with passing and failing
responses, and a few multi-instruction cases follow. NLTK's punkt data comes from the copy bundled
in the llama-index-core wheel (NLTK_DATA is pointed at it; nothing is downloaded); langdetect's
seed is fixed to 0 so its verdicts are reproducible.

Run with the reference venv:  $(scripts/setup-rewards-ref.sh | tail -1) scripts/gen-ifeval-fixtures.py
"""
import argparse
import json
import os
import sys


def _point_nltk_at_bundled_data():
    import importlib.util
    spec = importlib.util.find_spec("llama_index.core")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llama-index-core is not installed (run scripts/setup-rewards-ref.sh)")
    cache = os.path.join(list(spec.submodule_search_locations)[0], "_static", "nltk_cache")
    if not os.path.isdir(os.path.join(cache, "tokenizers", "punkt_tab")):
        sys.exit(f"no punkt_tab under {cache}")
    os.environ["NLTK_DATA"] = cache


_point_nltk_at_bundled_data()

import langdetect  # noqa: E402

langdetect.DetectorFactory.seed = 0

from lm_eval.tasks.ifeval import utils as ifeval_utils  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "rewards", "ifeval", "cases.jsonl")

LOREM = ("The city wakes slowly. Bakers open their doors before dawn. Buses hum along the empty "
         "streets. By seven the cafes are full. Nobody seems to be in a hurry.")
ESSAY = " ".join(["Rivers shape the land over many centuries."] * 30)


def paragraphs(n, sep="\n\n", word="Alpha"):
    return sep.join(f"{word} paragraph number {i} talks about rivers and hills." for i in range(1, n + 1))


C = []  # (ids, kwargs, prompt, response)


def add(iid, kw, response, prompt="Write something."):
    C.append(([iid], [kw], prompt, response))


# keywords:existence
for kw, r in [
    (["river", "stone"], "A river carved the stone."),
    (["river", "stone"], "A river carved the valley."),
    (["Apple"], "I like apples a lot."),
    (["apple"], "I like pears."),
    (["dog", "cat"], "DOG and CAT are friends."),
    (["dog", "cat"], "Dogs are friends."),
    (["sun"], "Sunday is sunny."),
    (["moon"], "The night was dark."),
    (["blue sky"], "Under the blue sky we walked."),
]:
    add("keywords:existence", {"keywords": kw}, r)
# keywords:frequency
for kw, r in [
    ({"keyword": "tree", "frequency": 3, "relation": "at least"}, "tree tree tree"),
    ({"keyword": "tree", "frequency": 3, "relation": "at least"}, "tree and Tree"),
    ({"keyword": "tree", "frequency": 3, "relation": "less than"}, "tree and Tree"),
    ({"keyword": "tree", "frequency": 2, "relation": "less than"}, "Trees: tree, street."),
    ({"keyword": "data", "frequency": 1, "relation": "at least"}, "No information here."),
    ({"keyword": "data", "frequency": 1, "relation": "less than"}, "No information here."),
    ({"keyword": "cat", "frequency": 2, "relation": "at least"}, "Concatenate the catalog."),
    ({"keyword": "ocean", "frequency": 4, "relation": "at least"}, "ocean " * 4),
    ({"keyword": "ocean", "frequency": 4, "relation": "less than"}, "ocean " * 4),
]:
    add("keywords:frequency", kw, r)
# keywords:forbidden_words
for kw, r in [
    (["bad", "evil"], "Everything is good."),
    (["bad", "evil"], "That was a bad idea."),
    (["bad"], "The badge was shiny."),
    (["Evil"], "no EVIL here"),
    (["happy", "sad"], "I am neither."),
    (["happy", "sad"], "Sad-faced clowns."),
    (["run"], "Running is fun."),
    (["run"], "I run daily."),
]:
    add("keywords:forbidden_words", {"forbidden_words": kw}, r)
# keywords:letter_frequency
for kw, r in [
    ({"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zebras zoom."),
    ({"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "A zebra."),
    ({"letter": "z", "let_frequency": 2, "let_relation": "less than"}, "A zebra."),
    ({"letter": "e", "let_frequency": 5, "let_relation": "less than"}, "Everyone here needs everything."),
    ({"letter": "a", "let_frequency": 3, "let_relation": "at least"}, "AAA"),
    ({"letter": "q", "let_frequency": 1, "let_relation": "at least"}, "No such letter."),
    ({"letter": "q", "let_frequency": 1, "let_relation": "less than"}, "No such letter."),
    ({"letter": "t", "let_frequency": 10, "let_relation": "at least"}, "tttt ttt tt t"),
]:
    add("keywords:letter_frequency", kw, r)
# language:response_language
for kw, r in [
    ({"language": "en"}, "This is a perfectly ordinary English sentence about the weather today."),
    ({"language": "en"}, "Ceci est une phrase tout à fait ordinaire en français sur le temps qu'il fait."),
    ({"language": "fr"}, "Ceci est une phrase tout à fait ordinaire en français sur le temps qu'il fait."),
    ({"language": "de"}, "Dies ist ein ganz gewöhnlicher deutscher Satz über das heutige Wetter."),
    ({"language": "de"}, "Esta es una frase completamente normal en español sobre el clima de hoy."),
    ({"language": "es"}, "Esta es una frase completamente normal en español sobre el clima de hoy."),
    ({"language": "ru"}, "Это совершенно обычное предложение на русском языке о сегодняшней погоде."),
    ({"language": "ja"}, "今日はとても良い天気ですね。散歩に行きましょう。"),
    ({"language": "ko"}, "오늘은 날씨가 정말 좋네요. 산책하러 갑시다."),
    ({"language": "hi"}, "This is English, not Hindi, so the check should fail for this response."),
]:
    add("language:response_language", kw, r)
# length_constraints:number_sentences
for kw, r in [
    ({"num_sentences": 5, "relation": "at least"}, LOREM),
    ({"num_sentences": 6, "relation": "at least"}, LOREM),
    ({"num_sentences": 5, "relation": "less than"}, LOREM),
    ({"num_sentences": 6, "relation": "less than"}, LOREM),
    ({"num_sentences": 3, "relation": "less than"}, "Mr. Smith met Dr. Jones at 5 p.m. on Friday. They talked."),
    ({"num_sentences": 2, "relation": "at least"}, "Is it raining? Yes! Take an umbrella."),
    ({"num_sentences": 4, "relation": "at least"}, "Is it raining? Yes! Take an umbrella."),
    ({"num_sentences": 2, "relation": "less than"}, "One sentence only, with e.g. an abbreviation."),
    ({"num_sentences": 3, "relation": "at least"}, "Version 2.5 shipped. It costs $3.50 now. See the U.S. site."),
]:
    add("length_constraints:number_sentences", kw, r)
# length_constraints:number_paragraphs
for kw, r in [
    ({"num_paragraphs": 3}, "First part.\n***\nSecond part.\n***\nThird part."),
    ({"num_paragraphs": 3}, "First part.\n***\nSecond part."),
    ({"num_paragraphs": 2}, "***\nFirst part.\n***\nSecond part.\n***"),
    ({"num_paragraphs": 2}, "First.\n***\n\n***\nSecond."),
    ({"num_paragraphs": 1}, "Just one block of text."),
    ({"num_paragraphs": 4}, "a\n* * *\nb\n***\nc\n***\nd"),
    ({"num_paragraphs": 3}, "a\n***\nb\n***\nc\n***\nd"),
    ({"num_paragraphs": 2}, "a ***b"),
]:
    add("length_constraints:number_paragraphs", kw, r)
# length_constraints:number_words
for kw, r in [
    ({"num_words": 100, "relation": "at least"}, ESSAY),
    ({"num_words": 300, "relation": "at least"}, ESSAY),
    ({"num_words": 300, "relation": "less than"}, ESSAY),
    ({"num_words": 10, "relation": "less than"}, "Short answer, with can't and well-known words."),
    ({"num_words": 5, "relation": "less than"}, "Short answer, with can't and well-known words."),
    ({"num_words": 3, "relation": "at least"}, "one two"),
    ({"num_words": 2, "relation": "at least"}, "one two"),
    ({"num_words": 4, "relation": "at least"}, "e-mail me at a_b@c.com"),
]:
    add("length_constraints:number_words", kw, r)
# length_constraints:nth_paragraph_first_word
for kw, r in [
    ({"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "beta"}, "Alpha one.\n\nBeta two.\n\nGamma three."),
    ({"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "beta"}, "Alpha one.\n\nGamma two.\n\nBeta three."),
    ({"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "hello"}, "\"Hello,\" she said.\n\nThen left."),
    ({"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"}, "Hi.\n\nThen! left.\n\nExtra."),
    ({"num_paragraphs": 3, "nth_paragraph": 3, "first_word": "end"}, "A.\n\n\n\nB.\n\nEnd."),
    ({"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "so"}, "A.\n\nSo, yes."),
    ({"num_paragraphs": 4, "nth_paragraph": 4, "first_word": "alpha"}, paragraphs(4)),
    ({"num_paragraphs": 5, "nth_paragraph": 1, "first_word": "alpha"}, paragraphs(4)),
]:
    add("length_constraints:nth_paragraph_first_word", kw, r)
# detectable_content:number_placeholders
for kw, r in [
    ({"num_placeholders": 2}, "Dear [name], your order [id] shipped."),
    ({"num_placeholders": 3}, "Dear [name], your order [id] shipped."),
    ({"num_placeholders": 1}, "No placeholders."),
    ({"num_placeholders": 1}, "Empty [] counts."),
    ({"num_placeholders": 2}, "[a [b] c] here"),
    ({"num_placeholders": 4}, "[1][2][3][4]"),
    ({"num_placeholders": 2}, "Link [text\nbroken] here [x]"),
    ({"num_placeholders": 1}, "[address]"),
]:
    add("detectable_content:number_placeholders", kw, r)
# detectable_content:postscript
for kw, r in [
    ({"postscript_marker": "P.S."}, "Hello.\n\nP.S. See you."),
    ({"postscript_marker": "P.S."}, "Hello.\n\nPS see you."),
    ({"postscript_marker": "P.P.S"}, "Hello.\nP.S. one\nP.P.S two"),
    ({"postscript_marker": "P.P.S"}, "Hello.\nP.S. one"),
    ({"postscript_marker": "P.S."}, "hello p. s. lowercase"),
    ({"postscript_marker": "Note:"}, "Body.\nnote: extra"),
    ({"postscript_marker": "Note:"}, "Body without it."),
    ({"postscript_marker": "P.S."}, "Bye. p.s.also fine"),
]:
    add("detectable_content:postscript", kw, r)
# detectable_format:number_bullet_lists
for kw, r in [
    ({"num_bullets": 3}, "* one\n* two\n* three"),
    ({"num_bullets": 3}, "* one\n* two"),
    ({"num_bullets": 2}, "- one\n- two"),
    ({"num_bullets": 2}, "* one\n- two\n**bold** line"),
    ({"num_bullets": 3}, "  * indented\n* two\n- three"),
    ({"num_bullets": 1}, "Text with - dash inside\n* item"),
    ({"num_bullets": 4}, "* a\n* b\n* c\n* d\n* e"),
    ({"num_bullets": 2}, "*a\n*b"),
]:
    add("detectable_format:number_bullet_lists", kw, r)
# detectable_format:constrained_response
for r in ["My answer is yes.", "My answer is no.", "  My answer is maybe.  ", "Yes.",
          "I think My answer is yes. indeed", "my answer is yes.", "My answer is Yes.", "My answer is no"]:
    add("detectable_format:constrained_response", {}, r)
# detectable_format:number_highlighted_sections
for kw, r in [
    ({"num_highlights": 2}, "*one* and *two*"),
    ({"num_highlights": 3}, "*one* and *two*"),
    ({"num_highlights": 1}, "**bold** text"),
    ({"num_highlights": 2}, "**bold** text"),
    ({"num_highlights": 1}, "* * empty"),
    ({"num_highlights": 1}, "*multi\nline*"),
    ({"num_highlights": 3}, "*a* *b* *c* *d*"),
    ({"num_highlights": 2}, "***triple*** x"),
]:
    add("detectable_format:number_highlighted_sections", kw, r)
# detectable_format:multiple_sections
for kw, r in [
    ({"section_spliter": "Section", "num_sections": 2}, "Section 1\nIntro\nSection 2\nBody"),
    ({"section_spliter": "Section", "num_sections": 3}, "Section 1\nIntro\nSection 2\nBody"),
    ({"section_spliter": "SECTION", "num_sections": 2}, "SECTION 1 a SECTION 2 b"),
    ({"section_spliter": "SECTION", "num_sections": 2}, "Section 1 a Section 2 b"),
    ({"section_spliter": "PARAGRAPH", "num_sections": 1}, "PARAGRAPH 1\ntext"),
    ({"section_spliter": "Day", "num_sections": 3}, "Day 1: rest. Day 2: walk. Day 3: swim."),
    ({"section_spliter": "Day", "num_sections": 3}, "Day one: rest. Day two: walk."),
    ({"section_spliter": "Part", "num_sections": 1}, "Partial 1 text"),
]:
    add("detectable_format:multiple_sections", kw, r)
# detectable_format:json_format
for r in ['{"a": 1}', '```json\n{"a": [1, 2]}\n```', '```\n{"a": 1}\n```', "{'a': 1}", "Here: {\"a\": 1}",
          '```JSON\n[1, 2, 3]\n```', '"just a string"', '{"a": 1,}', "  42  "]:
    add("detectable_format:json_format", {}, r)
# detectable_format:title
for r in ["<<My Title>>\nText", "No title here", "<<>> empty", "<<  >> blank", "<<line\nbreak>>",
          "Text <<Late Title>>", "<<<Nested>>>", "<< x >>"]:
    add("detectable_format:title", {}, r)
# combination:two_responses
for r in ["First answer.\n******\nSecond answer.", "Same.\n******\nSame.", "Only one answer.",
          "A\n******\nB\n******\nC", "******\nA\n******\nB\n******", "A\n******\n\n******\nB",
          "A ****** B", "A\n*****\nB"]:
    add("combination:two_responses", {}, r)
# combination:repeat_prompt
for p, r in [
    ("Write a poem about cats.", "Write a poem about cats. Cats are soft."),
    ("Write a poem about cats.", "Sure! Write a poem about cats."),
    ("Write a poem about cats.", "  write a POEM about cats. here"),
    ("Tell me a joke.", "Tell me a joke"),
    ("Tell me a joke.", "Tell me a joke. Why did the chicken cross the road?"),
    ("List three fruits.", "List three fruits: apple, pear, plum."),
    ("List three fruits.", "List three fruits. Apple, pear, plum."),
    ("Explain gravity.", "Gravity is a force."),
]:
    C.append((["combination:repeat_prompt"], [{"prompt_to_repeat": p}], p + " First repeat the request.", r))
# startend:end_checker
for kw, r in [
    ({"end_phrase": "Any other questions?"}, "Done. Any other questions?"),
    ({"end_phrase": "Any other questions?"}, "Done. Any other questions? Thanks."),
    ({"end_phrase": "Any other questions?"}, "Done. any other questions?  "),
    ({"end_phrase": "Is there anything else I can help with?"}, "\"Bye. Is there anything else I can help with?\""),
    ({"end_phrase": "Peace."}, "All done.\nPeace."),
    ({"end_phrase": "Peace."}, "All done.\nPeace"),
    ({"end_phrase": "The end"}, "It was fun. The End"),
    ({"end_phrase": "The end"}, "The end is near."),
]:
    add("startend:end_checker", kw, r)
# change_case:capital_word_frequency
for kw, r in [
    ({"capital_frequency": 2, "capital_relation": "at least"}, "This is VERY IMPORTANT."),
    ({"capital_frequency": 3, "capital_relation": "at least"}, "This is VERY IMPORTANT."),
    ({"capital_frequency": 3, "capital_relation": "less than"}, "This is VERY IMPORTANT."),
    ({"capital_frequency": 2, "capital_relation": "less than"}, "I said NO."),
    ({"capital_frequency": 2, "capital_relation": "at least"}, "I said NO."),
    ({"capital_frequency": 2, "capital_relation": "at least"}, "WELL-KNOWN facts, U.S.A. and A1."),
    ({"capital_frequency": 3, "capital_relation": "at least"}, "DON'T STOP now"),
    ({"capital_frequency": 1, "capital_relation": "less than"}, "all lowercase words here"),
]:
    add("change_case:capital_word_frequency", kw, r)
# change_case:english_capital
for r in ["THIS IS A RESPONSE WRITTEN ENTIRELY IN CAPITAL LETTERS ABOUT THE WEATHER.",
          "THIS IS MOSTLY CAPITAL BUT not ENTIRELY, ABOUT THE WEATHER TODAY.",
          "CECI EST UNE PHRASE EN FRANÇAIS SUR LE TEMPS QU'IL FAIT AUJOURD'HUI.",
          "HELLO WORLD, THIS IS A TEST OF THE SYSTEM WITH NUMBERS 123.",
          "12345", "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG EVERY SINGLE MORNING.",
          "The Quick Brown Fox.", "I LOVE READING BOOKS IN THE EVENING WITH A CUP OF TEA."]:
    add("change_case:english_capital", {}, r)
# change_case:english_lowercase
for r in ["this is a response written entirely in lowercase letters about the weather.",
          "this is mostly lowercase but Not entirely, about the weather today.",
          "ceci est une phrase en français sur le temps qu'il fait aujourd'hui.",
          "hello world, this is a test of the system with numbers 123.",
          "...", "the quick brown fox jumps over the lazy dog every single morning.",
          "i love reading books in the evening with a cup of tea.", "ALL CAPS TEXT HERE FOR THE TEST."]:
    add("change_case:english_lowercase", {}, r)
# punctuation:no_comma
for r in ["No commas here.", "One, comma.", "Full-width，comma", "Numbers like 1,000", "Semicolons; fine",
          "Ellipsis... fine", "Quote \"a,b\"", "Plain text"]:
    add("punctuation:no_comma", {}, r)
# startend:quotation
for r in ['"Wrapped in quotes."', 'Not wrapped.', '"Only start', '  "Padded"  ', '""', '"', "'single'",
          '"Multi\nline"', "“curly”"]:
    add("startend:quotation", {}, r)

# Multi-instruction cases, including kwargs written as in the HF dataset (every key, nulls).
C.append((["punctuation:no_comma", "detectable_format:title", "length_constraints:number_words"],
          [{}, {}, {"num_words": 5, "relation": "at least"}], "Write.",
          "<<A Poem>>\nThe river runs and the hills listen"))
C.append((["punctuation:no_comma", "detectable_format:title", "length_constraints:number_words"],
          [{}, {}, {"num_words": 50, "relation": "at least"}], "Write.",
          "<<A Poem>>\nThe river runs, and the hills listen"))
C.append((["keywords:existence", "change_case:english_lowercase"],
          [{"keywords": ["river"], "num_words": None, "relation": None},
           {"keywords": None, "num_words": None, "relation": None}],
          "Write.", "**the river** runs quietly through the green valley every spring."))
C.append((["detectable_format:number_bullet_lists", "startend:end_checker"],
          [{"num_bullets": 2}, {"end_phrase": "That is all."}], "List.",
          "Here you go:\n* first\n* second\nThat is all."))
C.append((["startend:quotation", "detectable_format:json_format"], [{}, {}], "Q.",
          "```json\n\"x\"\n```"))
C.append((["detectable_format:title", "startend:end_checker"], [{}, {"end_phrase": "Bye"}], "T.",
          "Sure, here it is:\n<<Title>>\nBody\n*Bye*"))


# Texts for a direct check of the sentence splitter (NLTK Punkt, English) and of the capital-word
# count (nltk.word_tokenize + str.isupper) that IFEval's checks use.
PUNKT_TEXTS = [
    LOREM, ESSAY[:400],
    "Mr. Smith met Dr. Jones at 5 p.m. on Friday. They talked.",
    "Version 2.5 shipped. It costs $3.50 now. See the U.S. site.",
    "He said \"Stop.\" Then he left. (This was odd.) Nobody followed!",
    "Wait... what? No way!! Really?! Yes.",
    "The list:\n1. apples\n2. pears\n3. plums\nThat is all.",
    "I met J. R. R. Tolkien once. He was kind.",
    "See e.g. the appendix. Also i.e. the notes. Done.",
    "Prices rose 3.5% in Jan. and Feb. Analysts were surprised.",
    "It was late at night.\n\nThe next day was sunny. Birds sang.",
    "What time is it? It's 10 a.m. Let's go.",
    "The U.S.A. is large. Canada is larger.",
    "Call me at 555-1234. Or email me@example.com. Thanks.",
    "She arrived on Jan. 5. The meeting began at noon.",
    "A sentence without a final period",
    "ALL CAPS SENTENCE HERE. ANOTHER ONE! AND A THIRD?",
    "Section 1. Introduction. Section 2. Methods.",
    "'Quoted start.' Another sentence. \u201cCurly quotes.\u201d Final one.",
    "Numbers: 1. 2. 3. Done.",
    "The St. Louis Cardinals won. Gen. Grant agreed. Prof. Lee did not.",
    "i don't know. maybe tomorrow. who knows",
    "Use the --verbose flag. Then run it again -- carefully.",
    "He scored 9.5/10. Amazing. Truly amazing...",
    "First line\nSecond line\nThird line.",
    "Dear [name],\n\nThanks for your order. It ships soon.\n\nP.S. Check your inbox.",
    "* bullet one.\n* bullet two.\n* bullet three.",
    "<<Title>>\nThe body. More body.",
    "It cost 10 dollars (approx.). Then it rose.",
    "The end. THE END. The End!",
    "This is VERY IMPORTANT. DON'T STOP NOW. I'M SERIOUS, OK?",
    "The NASA-led mission (with ESA) launched in the U.K. region; NATO watched.",
    "e.g. this starts lowercase. So does i.e. this one.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--self-check", action="store_true", help="only check that the reference imports")
    args = ap.parse_args()
    if args.self_check:
        from lm_eval.tasks.ifeval import instructions_util
        assert instructions_util.count_sentences("One. Two.") == 2
        print("ok")
        return
    import nltk
    from lm_eval.tasks.ifeval import instructions_util
    tok = instructions_util._get_sentence_tokenizer()
    punkt_out = os.path.join(os.path.dirname(args.out), "punkt.jsonl")
    with open(punkt_out, "w") as f:
        f.write(json.dumps({"generator": "scripts/gen-ifeval-fixtures.py", "nltk": nltk.__version__}) + "\n")
        for text in PUNKT_TEXTS:
            words = nltk.word_tokenize(text)
            f.write(json.dumps({"text": text, "sentences": tok.tokenize(text),
                                "capital_words": sum(1 for w in words if w.isupper()),
                                "word_tokens": words}, ensure_ascii=False) + "\n")
    rows = []
    for key, (ids, kwargs, prompt, response) in enumerate(C):
        inp = ifeval_utils.InputExample(key=key, instruction_id_list=ids, prompt=prompt, kwargs=kwargs)
        strict = ifeval_utils.test_instruction_following_strict(inp, response)
        loose = ifeval_utils.test_instruction_following_loose(inp, response)
        rows.append({"instruction_id_list": ids, "kwargs": kwargs, "prompt": prompt, "response": response,
                     "strict": strict.follow_instruction_list, "loose": loose.follow_instruction_list})
    with open(args.out, "w") as f:
        f.write(json.dumps({"generator": "scripts/gen-ifeval-fixtures.py", "lm_eval": "0.4.13",
                            "langdetect_seed": 0, "count": len(rows)}) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    import collections
    per = collections.Counter()
    for r in rows:
        for i, s in zip(r["instruction_id_list"], r["strict"]):
            per[(i, s)] += 1
    for (i, s), n in sorted(per.items()):
        print(f"{i:50s} {s!s:6s} {n}", file=sys.stderr)
    print(f"wrote {len(rows)} cases to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
