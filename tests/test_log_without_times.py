"""A log kept without session ids or times, on the real MiniLM (issue 49, logs as people have them).

Four chats of one user (a dinner party at the flat in Oslo, learning the guitar, a job
interview, settling in after the move to Bergen) imported as one session without times: nothing
but the turns tells where one chat ends. The learned start detector keeps only the starts it is
sure of (here one of the three: every start it keeps is a true one), and "Where do I live now?"
is answered by the latest chat, as it is when the log keeps its sessions.
"""

from __future__ import annotations

import pytest
from reflective_memory import ReflectiveMemory
from reflective_memory.retrieval.units import CONVERSATION_STARTS

pytestmark = pytest.mark.integration

OSLO = [
    (
        "user",
        "I'm hosting a dinner party at my flat in Oslo on Saturday for six friends from work. "
        "I want something that feels special but doesn't keep me in the kitchen all evening, "
        "and I'd like to serve a few Norwegian classics. Can you help me plan a menu?",
    ),
    (
        "assistant",
        "Of course! For six people a three-course menu works well: a light starter such as a "
        "beetroot and goat cheese salad, a main like baked salmon with dill potatoes, and a "
        "simple dessert such as cloudberry cream. Do any of your guests have dietary "
        "restrictions?",
    ),
    ("user", "One friend is vegetarian and another can't eat gluten."),
    (
        "assistant",
        "Then make the main course adaptable: serve the salmon alongside a mushroom and "
        "barley risotto for your vegetarian friend, but swap the barley for arborio rice so "
        "it is gluten-free too. The salad and the cloudberry cream are naturally gluten-free.",
    ),
    ("user", "My kitchen in the Oslo flat is tiny, only two burners. Will that work?"),
    (
        "assistant",
        "Yes, if you plan around the oven. Bake the salmon and roast the potatoes in the oven"
        " together, and keep the burners for the risotto. Prepare the salad and dessert in "
        "the morning and keep them in the fridge.",
    ),
    ("user", "How much salmon should I buy for six people?"),
    (
        "assistant",
        "Plan on about 180 to 200 grams per person, so roughly 1.2 kilograms for six. If your"
        " vegetarian friend eats only the risotto, one kilogram is enough.",
    ),
    ("user", "What wine goes with baked salmon?"),
    (
        "assistant",
        "A dry white such as a Riesling or a Chablis pairs well with salmon and dill. If some"
        " guests prefer red, a light Pinot Noir also works.",
    ),
    ("user", "Can you write a shopping list for everything?"),
    (
        "assistant",
        "Here is your list: 1.2 kg salmon, 1.5 kg small potatoes, fresh dill, 3 beetroots, "
        "goat cheese, mixed greens, walnuts, 300 g mushrooms, arborio rice, parmesan, "
        "vegetable stock, cloudberry jam, whipping cream, two bottles of Riesling and lemons.",
    ),
    ("user", "Thanks, that's really helpful."),
    ("assistant", "You're welcome! Enjoy the dinner party, and I hope your friends love the menu."),
]
GUITAR = [
    (
        "user",
        "I've wanted to play an instrument for years and I finally have some free evenings, so "
        "I want to start learning the guitar. My budget is around 300 euros. Should I get an "
        "acoustic or an electric one?",
    ),
    (
        "assistant",
        "Both are fine for beginners. An acoustic guitar needs nothing else and builds finger"
        " strength, while an electric guitar has lighter strings and is easier to press but "
        "needs an amplifier. Which music do you want to play?",
    ),
    ("user", "Mostly folk songs and some classic rock."),
    (
        "assistant",
        "Then an acoustic guitar is a good start: folk songs sound best on it, and you can "
        "still strum rock songs. A steel-string dreadnought or a smaller concert body would "
        "suit you.",
    ),
    ("user", "How often should I practise as a beginner?"),
    (
        "assistant",
        "Fifteen to thirty minutes every day beats two long sessions a week. Short daily "
        "practice builds calluses and muscle memory without sore fingers.",
    ),
    ("user", "Which chords should I learn first?"),
    (
        "assistant",
        "Start with G, C, D, E minor and A minor. With those five open chords you can already"
        " play hundreds of folk and rock songs.",
    ),
    ("user", "My fingertips hurt after playing. Is that normal?"),
    (
        "assistant",
        "Yes, that is normal during the first weeks. Your fingertips will form calluses. Take"
        " a break when it hurts, and make sure the strings are not set too high above the "
        "fretboard.",
    ),
    ("user", "Can you suggest an easy song to practise those chords?"),
    (
        "assistant",
        "Try 'Knockin' on Heaven's Door': it uses only G, D, A minor and C, at a slow tempo, "
        "so it is ideal for practising chord changes.",
    ),
    ("user", "Great, I'll try that tonight."),
    ("assistant", "Have fun! Focus on clean chord changes before speed."),
]
INTERVIEW = [
    (
        "user",
        "I have a job interview for a data analyst position at a logistics company on "
        "Thursday. It's a panel of three people and a short technical test, and I haven't "
        "interviewed in four years. How should I prepare?",
    ),
    (
        "assistant",
        "Start by reading the job description closely and matching each requirement to an "
        "example from your experience. Expect questions on SQL, spreadsheets and how you explain "
        "results to people without a technical background.",
    ),
    ("user", "What SQL questions do they usually ask?"),
    (
        "assistant",
        "Typical ones are joins between two tables, grouping with aggregates, filtering groups "
        "with HAVING, window functions such as ranking rows, and finding duplicates. Practise "
        "writing them by hand.",
    ),
    ("user", "How do I answer 'tell me about yourself'?"),
    (
        "assistant",
        "Keep it to about two minutes: your current role, one or two achievements with numbers, "
        "and why this position is the natural next step for you.",
    ),
    ("user", "Should I ask them questions at the end?"),
    (
        "assistant",
        "Yes, always. Ask what a typical week looks like, which tools the team uses, and how "
        "success in the role is measured during the first six months.",
    ),
    ("user", "What should I wear to the interview?"),
    (
        "assistant",
        "Dress one step more formal than the team's everyday clothes. For most analyst roles, "
        "smart trousers and a shirt or blouse are a safe choice.",
    ),
    ("user", "How long should I wait before following up?"),
    (
        "assistant",
        "Send a short thank-you email the same day, and if you hear nothing within the time "
        "they gave you, follow up politely a few days after it.",
    ),
    ("user", "Okay, I feel more prepared now."),
    ("assistant", "Good luck on Thursday! You've got this."),
]
BERGEN = [
    (
        "user",
        "I just moved to Bergen last week and I live in a flat near Bryggen now. Everything is "
        "still in boxes and I don't know anyone here yet, and there is so much paperwork. "
        "What should I set up first?",
    ),
    (
        "assistant",
        "Congratulations on the move! Start with the essentials: register your new address "
        "with the national registry, set up internet and electricity in your name, and update"
        " your address with your bank and employer.",
    ),
    ("user", "How do I register my new address in Norway?"),
    (
        "assistant",
        "You report the move to the Norwegian Tax Administration (Skatteetaten) online within"
        " eight days of moving. Log in with BankID and fill in the change of address form.",
    ),
    ("user", "Which internet providers are common in Bergen?"),
    (
        "assistant",
        "Telenor, Telia and Altibox are common choices in Bergen. Check which ones offer "
        "fibre at your building, since many flats near the city centre already have a fibre "
        "connection.",
    ),
    ("user", "It rains a lot here. What kind of jacket should I buy?"),
    (
        "assistant",
        "Bergen is one of the rainiest cities in Europe, so get a proper waterproof shell "
        "jacket with sealed seams and a hood. Many locals also keep rain trousers and "
        "waterproof boots for the worst days.",
    ),
    ("user", "Are there good places to go hiking near the city?"),
    (
        "assistant",
        "Yes! Mount Fløyen is right above the city and you can take the funicular up or hike."
        " Mount Ulriken offers a longer hike, and the Vidden trail between them is a classic "
        "full-day walk.",
    ),
    ("user", "How do I get around the city without a car?"),
    (
        "assistant",
        "Bergen has the Bybanen light rail and Skyss buses. Buy tickets in the Skyss app, and"
        " a monthly pass is cheaper if you commute every day.",
    ),
    ("user", "Thanks, this helps a lot with settling in."),
    ("assistant", "You're welcome! Enjoy your new home in Bergen."),
]


CHATS = (OSLO, GUITAR, INTERVIEW, BERGEN)
MOVED = BERGEN[0][1]


@pytest.fixture(scope="module")
def minilm():
    with ReflectiveMemory(None) as mem:  # loads the bundled model once for the module
        yield mem.embedder


def _log(mem: ReflectiveMemory, sessions: bool) -> None:
    turns = [
        {
            "user_id": "u",
            "session_id": f"chat-{c}" if sessions else "log",
            "role": role,
            "text": text,
        }
        for c, chat in enumerate(CHATS)
        for role, text in chat
    ]
    mem.add_turns(turns)  # one call, no times: every turn takes one time
    for sid in sorted({t["session_id"] for t in turns}):
        mem.end_session("u", sid)


def _first(mem: ReflectiveMemory, question: str) -> str:
    return mem.retrieve("u", question, k=3).hits[0].memory.text.splitlines()[-1]


def test_the_chats_of_a_log_without_times_are_found(minilm):
    with ReflectiveMemory(None, embedder=minilm) as mem:
        _log(mem, sessions=False)
        marks = {
            tuple(m.metadata[CONVERSATION_STARTS])
            for m in mem.memories("u")
            if CONVERSATION_STARTS in m.metadata
        }
        starts = {sum(len(c) for c in CHATS[:i]) for i in range(1, len(CHATS))}
        # kept only where it is confident: every start found is one, not every one is found
        (found,) = marks
        assert found and set(found) <= starts


def test_where_do_i_live_now_reads_the_latest_chat_as_with_sessions(minilm):
    answers = []
    for sessions in (False, True):
        with ReflectiveMemory(None, embedder=minilm) as mem:
            _log(mem, sessions=sessions)
            answers.append(_first(mem, "Where do I live now?"))
    assert answers[0] == answers[1] and answers[0].endswith(MOVED)
