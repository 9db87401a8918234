"""penalties.edits: each pattern kind the lexical proposer writes can be taken out of a reply and
put into one, the rest of the reply kept; what no edit can express says so."""

from __future__ import annotations

import pytest

from dynalize.penalties.edits import (PADDING, bare_transplant, carrier_sentence, delete, form_of, insert, opens_replies,
                                      shows, transplant)
from dynalize.penalties.surface import length_feature, ngram_feature, reply_features, word_count

REPLY = "Great question! The cat sleeps on the mat. Indeed it is warm there, honestly. Does that help?"
PLAIN = "The dog runs in the park. It likes the red ball."


def feature(key: str, text: str = REPLY):
    return form_of(reply_features(text)[key].regex)


def test_every_kind_the_lexical_proposer_writes_is_editable_both_ways():
    kinds = {}
    for key, f in reply_features(REPLY + " Wow!!").items():
        form = form_of(f.regex)
        kinds[key.partition(":")[0]] = form.kind
        assert delete(form, REPLY + " Wow!!") is not None, key
    kinds["length"] = form_of(length_feature(12).regex).kind
    assert kinds == {"ngram1": "phrase", "ngram2": "phrase", "ngram3": "phrase", "open1": "opener", "open2": "opener",
                     "closep": "punct", "closeword": "last_word", "length": "length"}
    assert form_of(reply_features(REPLY)["close?:?"].regex).kind == "question"


def test_an_opener_is_removed_with_its_punctuation_and_put_first():
    form = feature("open2:great question!")
    assert delete(form, REPLY) == "The cat sleeps on the mat. Indeed it is warm there, honestly. Does that help?"
    assert insert(form, PLAIN) == "Great question! " + PLAIN
    word = form_of(reply_features("Well, the dog.")["open1:well,"].regex)
    assert delete(word, "Well, the dog ran.") == "The dog ran."
    assert insert(word, "The dog ran.") == "Well, the dog ran."


def test_a_line_marker_is_taken_off_every_line_and_makes_each_sentence_an_item():
    items = "- The cat sleeps.\n- It is warm.\n- Good night."
    dash = form_of(reply_features(items)["open1:-"].regex)
    assert dash.kind == "marker"
    assert delete(dash, items) == "The cat sleeps.\nIt is warm.\nGood night."  # no list left, not just no first dash
    assert insert(dash, PLAIN) == "- The dog runs in the park.\n- It likes the red ball."
    numbered = form_of(reply_features("1. A cat.\n2. A dog.")["open1:1."].regex)
    assert delete(numbered, "1. A cat.\n2. A dog.") == "A cat.\nA dog."
    assert insert(numbered, PLAIN) == "1. The dog runs in the park.\n2. It likes the red ball."
    heading = form_of(reply_features("# Cats\nThey sleep.")["open1:#"].regex)
    assert delete(heading, "# Cats\nThey sleep.") == "Cats\nThey sleep."
    assert insert(heading, PLAIN) == "# The dog runs in the park.\nIt likes the red ball."


def test_an_ending_mark_becomes_a_full_stop_and_back():
    question = feature("close?:?")
    assert delete(question, REPLY).endswith("Does that help.")
    assert insert(question, PLAIN) == "The dog runs in the park. It likes the red ball?"
    bang = form_of(reply_features("So fun!!")["closep:!!"].regex)
    assert delete(bang, "So fun!!") == "So fun."
    assert insert(bang, PLAIN).endswith("red ball!!")


def test_a_last_word_is_removed_and_put_last():
    form = feature("closeword:help")
    assert delete(form, REPLY).endswith("Does that.")
    assert insert(form, PLAIN) == "The dog runs in the park. It likes the red ball help."


def test_a_phrase_is_removed_everywhere_and_the_text_stays_well_formed():
    form = form_of(ngram_feature(("great", "question")).regex)
    text = "Great question! The cat. Hi, great question! Yes, great question, it is."
    assert delete(form, text) == "The cat. Hi! Yes, it is."
    indeed = feature("ngram1:indeed")
    assert delete(indeed, REPLY) == "Great question! The cat sleeps on the mat. It is warm there, honestly. Does that help?"


def test_a_phrase_is_inserted_where_the_replies_that_show_it_have_it():
    form = form_of(ngram_feature(("indeed",)).regex)
    assert insert(form, PLAIN) == "The dog runs in the park. Indeed, it likes the red ball."
    assert insert(form, PLAIN, first=True) == "Indeed, the dog runs in the park. It likes the red ball."
    assert opens_replies(form, ["Indeed, yes. No.", "Indeed it is. Fine."])
    assert not opens_replies(form, ["Yes. Indeed, no.", "Indeed it is. Fine.", "A. B indeed."])


def test_a_length_bar_is_crossed_by_content_free_padding_and_trimmed_by_dropping_the_least_contentful():
    form = form_of(length_feature(12).regex)
    padded = insert(form, PLAIN)
    assert word_count(padded) > 12 and padded.startswith(PLAIN) and padded[len(PLAIN) + 1:] in " ".join(PADDING)
    long = ("Great question! Cats sleep curled near warm stoves. It is what it is, so to say. "
            "Sleeping cats conserve energy efficiently.")
    trimmed = delete(form_of(length_feature(13).regex), long)  # 21 words: 2 + 6 + 8 + 5
    # the opening sentence is kept, the content-free one dropped first, the contentful kept
    assert trimmed == "Great question! Cats sleep curled near warm stoves. Sleeping cats conserve energy efficiently."
    assert delete(form_of(length_feature(4).regex), "One two three four five six seven.") == "One two three four."
    assert insert(form, padded) is None and delete(form, PLAIN) is None


def test_any_other_regex_can_be_deleted_but_not_inserted():
    form = form_of(r"very \w+")
    assert form.kind == "regex"
    assert delete(form, "It is very warm and very nice.") == "It is and."
    assert insert(form, PLAIN) is None


@pytest.mark.parametrize("regex_, detector", [(None, None), (None, "repetition"), ("(unclosed", None)])
def test_a_detector_a_description_or_a_broken_regex_is_not_editable(regex_, detector):
    assert form_of(regex_, detector) is None


def test_a_text_pattern_is_transplanted_with_the_sentence_that_carries_it():
    fragment = form_of(ngram_feature(("long", "run")).regex)
    donor = "Cats sleep a lot. It matters in the long run. They wake at dawn."
    sentence = carrier_sentence(fragment, donor)
    assert sentence == "It matters in the long run."  # the whole paid phrase around the fragment
    assert transplant(fragment, PLAIN, sentence) == PLAIN + " It matters in the long run."
    assert transplant(fragment, PLAIN, sentence, first=True) == "It matters in the long run. " + PLAIN
    opener = feature("open1:great")
    assert transplant(opener, PLAIN, carrier_sentence(opener, REPLY)) == "Great question! " + PLAIN
    assert transplant(fragment, donor, sentence) is None  # already shows it


def test_a_transplant_s_control_is_its_sentence_put_in_bare_where_the_transplant_puts_it():
    fragment = form_of(ngram_feature(("long", "run")).regex)
    sentence = "It matters in the long run."
    bare = bare_transplant(fragment, PLAIN, sentence)
    assert bare == PLAIN + " It matters in the." and shows(fragment, bare) is False
    assert bare_transplant(fragment, PLAIN, sentence, first=True).endswith(PLAIN)
    opener = feature("open1:great")
    assert bare_transplant(opener, PLAIN, "Great!") is None  # nothing of the sentence is left: the reply itself
    assert bare_transplant(fragment, "It matters in the long run.", sentence) is None  # the reply shows it


def _family(name: str, prefix: str, texts: list[str]):
    from dynalize.penalties.families import family_feature

    return form_of(family_feature(name, [next(f for k, f in reply_features(t).items() if k.startswith(prefix))
                                         for t in texts]).regex)


def test_a_family_is_edited_member_by_member_as_each_member_is_alone():
    closers = ["Sure. Let me know if you want more!", "Fine. Feel free to ask for details.", "Ok. Happy to help further!"]
    family = _family("closers", "closeword:", closers)
    assert family.kind == "family" and [m.kind for m in family.members] == ["last_word"] * 3
    for text, member in zip(closers, family.members):
        assert delete(family, text) == delete(member, text)  # a finished sentence, as a closer's own edit leaves
    assert delete(family, "The dog ran. Tell me if you want more details.") == "The dog ran. Tell me if you want."
    assert delete(family, "Nothing here.") is None and insert(family, "Nothing here.") is None
    assert carrier_sentence(family, "Happy to help further! The dog ran. Ask me for more.") == "Ask me for more."
    openers = _family("openers", "open1:", ["Great question! The cat.", "Wow, the dog ran."])
    assert [m.kind for m in openers.members] == ["opener", "opener"]
    assert delete(openers, "Wow, the dog ran.") == "The dog ran."
    words = _family("words", "ngram1:", ["empower", "empowering"])
    assert delete(words, "We empower people by empowering them.") == "We people by them."


def test_an_alternation_that_is_not_a_family_of_editable_members_stays_a_regex():
    assert form_of(r"(?:foo|bar)").kind == "regex"
    assert form_of(r"(?:[|)]x)|(?:y\))").kind == "regex"  # a member no edit reads: the whole is a regex
    assert form_of(r"colou?r|gray").kind == "regex"
