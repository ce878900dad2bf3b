"""Time and "now" in five languages on the real MiniLM (issue 49, item 5).

One short history per language, of user and assistant turns over five months: a move to one
city, other chat, a later move to another, an event exactly two weeks before the last turn, and
more chat. Asked in that language, "where do I live now?" puts the newest home first (at k=3
and within the default budget) and "what did I do two weeks ago?" the turn of two weeks before.
The older home statement says "now" too, as people do when they have just moved: searched as a
word, the cue matched it (before the cue was read in languages other than English, the old city
came first in German, French, Spanish and Norwegian); other turns say "did" as the question
does, so only the time frame picks the event.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from reflective_memory import ReflectiveMemory

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class History:
    """A history in one language and what its two questions must find first."""

    now: str  # "where do I live now?"
    ago: str  # "what did I do two weeks ago?"
    new: str  # the newest home's city
    old: str  # the older home's city
    event: str  # a word of the turn of two weeks before
    sessions: list[tuple[str, list[str]]]  # (day, turns alternating user and assistant)


HISTORIES = {
    "en": History(
        now="Where do I live now?",
        ago="What did I do two weeks ago?",
        new="Bristol",
        old="Leeds",
        event="pottery",
        sessions=[
            (
                "2025-01-10",
                [
                    "I've moved to Leeds! Now I live in a small flat in Headingley.",
                    "Congratulations on the move! Leeds is a lively city.",
                    "Thanks! I got a job as a nurse at St James's.",
                    "That sounds exciting, if demanding.",
                ],
            ),
            (
                "2025-02-14",
                [
                    "This weekend I did some skiing in the Cairngorms with friends.",
                    "Lovely! The Cairngorms are beautiful this time of year.",
                    "I want to learn to bake sourdough bread. Do you have a simple recipe?",
                    (
                        "Mix starter, flour, water and salt, let the dough rise overnight and "
                        "bake it in a hot pot."
                    ),
                ],
            ),
            (
                "2025-04-03",
                [
                    "Big news: I've moved to Bristol and live in a flat in Clifton.",
                    "How exciting! Good luck with your new life in Bristol.",
                ],
            ),
            (
                "2025-05-02",
                [
                    "Today I did something new: I went to a pottery class and made a mug.",
                    "How fun! Pottery is a lovely hobby.",
                ],
            ),
            (
                "2025-05-16",
                [
                    "Yesterday I did a big spring clean of the whole flat.",
                    "Well done! A clean home feels great.",
                    "Can you recommend a good crime novel?",
                    "Try 'The Cuckoo's Calling' by Robert Galbraith.",
                ],
            ),
        ],
    ),
    "nb": History(
        now="Hvor bor jeg nå?",
        ago="Hva gjorde jeg for to uker siden?",
        new="Trondheim",
        old="Bergen",
        event="keramikkurs",
        sessions=[
            (
                "2025-01-10",
                [
                    "Jeg har flyttet til Bergen! Nå bor jeg i en liten leilighet i Sandviken.",
                    "Gratulerer med flyttingen! Bergen er en vakker by, selv om det regner mye.",
                    "Takk! Jeg har fått jobb som sykepleier på Haukeland.",
                    "Det høres ut som en spennende, men travel jobb.",
                ],
            ),
            (
                "2025-02-14",
                [
                    "Forrige helg gjorde jeg en lang skitur på Fløyen med noen kolleger.",
                    "Det høres deilig ut! Skiturer i helgene er en fin vane.",
                    "Jeg vil lære å bake surdeigsbrød. Har du en enkel oppskrift?",
                    (
                        "Bland surdeigsstarter, mel, vann og salt, la deigen heve over natten "
                        "og stek den i en varm gryte."
                    ),
                ],
            ),
            (
                "2025-04-03",
                [
                    (
                        "Store nyheter: jeg har flyttet til Trondheim og bor i en "
                        "leilighet på Møllenberg."
                    ),
                    "Så spennende! Lykke til med den nye hverdagen i Trondheim.",
                ],
            ),
            (
                "2025-05-02",
                [
                    "I dag gjorde jeg noe nytt: jeg var på keramikkurs og lagde en kopp.",
                    "Så gøy! Keramikk er en fin hobby.",
                ],
            ),
            (
                "2025-05-16",
                [
                    "I går gjorde jeg storrengjøring i hele leiligheten.",
                    "Godt jobbet! Det er deilig med et rent hjem.",
                    "Kan du anbefale en god krimroman?",
                    "Prøv «Snømannen» av Jo Nesbø.",
                ],
            ),
        ],
    ),
    "de": History(
        now="Wo wohne ich jetzt?",
        ago="Was habe ich vor zwei Wochen gemacht?",
        new="München",
        old="Hamburg",
        event="Töpferkurs",
        sessions=[
            (
                "2025-01-10",
                [
                    (
                        "Ich bin nach Hamburg gezogen! Jetzt wohne ich in einer "
                        "kleinen Wohnung in Altona."
                    ),
                    (
                        "Glückwunsch zum Umzug! Hamburg ist eine schöne Stadt, auch "
                        "wenn es oft regnet."
                    ),
                    "Danke! Ich habe eine Stelle als Krankenpfleger im UKE bekommen.",
                    "Das klingt nach einer spannenden, aber anstrengenden Arbeit.",
                ],
            ),
            (
                "2025-02-14",
                [
                    (
                        "Letztes Wochenende habe ich mit Kollegen eine lange Radtour "
                        "an der Elbe gemacht."
                    ),
                    "Das klingt herrlich! Radtouren am Wochenende sind eine schöne Gewohnheit.",
                    "Ich möchte lernen, Sauerteigbrot zu backen. Hast du ein einfaches Rezept?",
                    (
                        "Mische Sauerteig, Mehl, Wasser und Salz, lass den Teig über Nacht "
                        "gehen und backe ihn in einem heißen Topf."
                    ),
                ],
            ),
            (
                "2025-04-03",
                [
                    (
                        "Große Neuigkeiten: Ich bin nach München umgezogen und wohne in einer "
                        "Wohnung in Schwabing."
                    ),
                    "Wie aufregend! Viel Glück mit dem neuen Alltag in München.",
                ],
            ),
            (
                "2025-05-02",
                [
                    (
                        "Heute habe ich zum ersten Mal einen Töpferkurs gemacht und "
                        "eine Tasse geformt."
                    ),
                    "Wie schön! Töpfern ist ein tolles Hobby.",
                ],
            ),
            (
                "2025-05-16",
                [
                    "Gestern habe ich einen großen Frühjahrsputz in der ganzen Wohnung gemacht.",
                    "Gut gemacht! Ein sauberes Zuhause tut gut.",
                    "Kannst du mir einen guten Krimi empfehlen?",
                    "Versuch es mit „Der Schwarm“ von Frank Schätzing.",
                ],
            ),
        ],
    ),
    "fr": History(
        now="Où est-ce que j'habite maintenant ?",
        ago="Qu'est-ce que j'ai fait il y a deux semaines ?",
        new="Bordeaux",
        old="Lyon",
        event="poterie",
        sessions=[
            (
                "2025-01-10",
                [
                    (
                        "J'ai déménagé à Lyon ! Maintenant j'habite dans un petit appartement "
                        "à la Croix-Rousse."
                    ),
                    "Félicitations pour le déménagement ! Lyon est une très belle ville.",
                    "Merci ! J'ai trouvé un poste d'infirmier à l'hôpital Édouard-Herriot.",
                    "Ça a l'air d'un travail passionnant mais fatigant.",
                ],
            ),
            (
                "2025-02-14",
                [
                    "Ce week-end, j'ai fait du ski à Chamonix avec des amis.",
                    "Super ! Chamonix est magnifique en cette saison.",
                    "Je voudrais apprendre à faire du pain au levain. Tu as une recette simple ?",
                    (
                        "Mélange le levain, la farine, l'eau et le sel, laisse lever la pâte "
                        "toute la nuit et cuis-la dans une cocotte bien chaude."
                    ),
                ],
            ),
            (
                "2025-04-03",
                [
                    (
                        "Grande nouvelle : j'ai déménagé à Bordeaux, j'habite dans le quartier "
                        "des Chartrons."
                    ),
                    "Quelle aventure ! Bonne installation à Bordeaux.",
                ],
            ),
            (
                "2025-05-02",
                [
                    "Aujourd'hui, j'ai fait un cours de poterie pour la première fois.",
                    "Génial ! La poterie est un loisir formidable.",
                ],
            ),
            (
                "2025-05-16",
                [
                    "Hier, j'ai fait un grand ménage de printemps dans tout l'appartement.",
                    "Bravo ! Un intérieur propre, ça fait du bien.",
                    "Tu peux me conseiller un bon polar ?",
                    "Essaie « Les Rivières pourpres » de Jean-Christophe Grangé.",
                ],
            ),
        ],
    ),
    "es": History(
        now="¿Dónde vivo ahora?",
        ago="¿Qué hice hace dos semanas?",
        new="Valencia",
        old="Sevilla",
        event="cerámica",
        sessions=[
            (
                "2025-01-10",
                [
                    "¡Me he mudado a Sevilla! Ahora vivo en un piso pequeño en Triana.",
                    "¡Enhorabuena por la mudanza! Sevilla es una ciudad preciosa.",
                    (
                        "¡Gracias! He conseguido un trabajo de enfermera en el "
                        "hospital Virgen del Rocío."
                    ),
                    "Suena a un trabajo apasionante, aunque cansado.",
                ],
            ),
            (
                "2025-02-14",
                [
                    (
                        "El fin de semana pasado hice una larga ruta en bici por el "
                        "Guadalquivir con unos compañeros."
                    ),
                    "¡Qué plan! Las rutas de fin de semana son una buena costumbre.",
                    "Quiero aprender a hacer pan de masa madre. ¿Tienes una receta sencilla?",
                    (
                        "Mezcla la masa madre, la harina, el agua y la sal, deja fermentar la "
                        "masa toda la noche y hornéala en una olla muy caliente."
                    ),
                ],
            ),
            (
                "2025-04-03",
                [
                    (
                        "Gran noticia: me he mudado a Valencia y vivo en un piso en "
                        "el barrio de Ruzafa."
                    ),
                    "¡Qué emoción! Mucha suerte con la nueva vida en Valencia.",
                ],
            ),
            (
                "2025-05-02",
                [
                    "Hoy hice una clase de cerámica por primera vez.",
                    "¡Qué bien! La cerámica es una afición estupenda.",
                ],
            ),
            (
                "2025-05-16",
                [
                    "Ayer hice una limpieza a fondo de todo el piso.",
                    "¡Bien hecho! Da gusto tener la casa limpia.",
                    "¿Me recomiendas una buena novela negra?",
                    "Prueba «La verdad sobre el caso Savolta» de Eduardo Mendoza.",
                ],
            ),
        ],
    ),
}


@pytest.fixture(scope="module")
def mem():
    with ReflectiveMemory() as m:
        for lang, history in HISTORIES.items():
            for i, (day, turns) in enumerate(history.sessions):
                for j, text in enumerate(turns):
                    role = "user" if j % 2 == 0 else "assistant"
                    m.add_turn(lang, f"s{i}", role, text, timestamp=f"{day}T19:00:00")
                m.end_session(lang, f"s{i}")
        yield m


BUDGETS = [pytest.param({"k": 3}, id="k3"), pytest.param({}, id="default-budget")]


@pytest.mark.parametrize("lang", sorted(HISTORIES))
@pytest.mark.parametrize("size", BUDGETS)
def test_where_do_i_live_now_puts_the_newest_home_first(mem, lang: str, size: dict) -> None:
    history = HISTORIES[lang]
    r = mem.retrieve(lang, history.now, **size)
    assert r.diagnostics["passages"]["present_tense"] is True
    first = r.hits[0].memory.text
    assert history.new in first and history.old not in first, first


@pytest.mark.parametrize("lang", sorted(HISTORIES))
@pytest.mark.parametrize("size", BUDGETS)
def test_two_weeks_ago_puts_that_turn_first(mem, lang: str, size: dict) -> None:
    history = HISTORIES[lang]
    r = mem.retrieve(lang, history.ago, **size)
    frame = r.diagnostics["time_frame"]
    assert (frame["start"][:10], frame["end"][:10]) == ("2025-04-29", "2025-05-06"), frame
    assert history.event in r.hits[0].memory.text.split("\n")[1], r.hits[0].memory.text


@pytest.fixture(scope="module")
def untimed():
    """The same histories imported without a time on any turn (sessions kept, in order)."""
    with ReflectiveMemory() as m:
        for lang, history in HISTORIES.items():
            m.add_turns(
                {
                    "user_id": lang,
                    "session_id": f"s{i}",
                    "role": "user" if j % 2 == 0 else "assistant",
                    "text": text,
                }
                for i, (_, turns) in enumerate(history.sessions)
                for j, text in enumerate(turns)
            )
            for i in range(len(history.sessions)):
                m.end_session(lang, f"s{i}")
        yield m


@pytest.mark.parametrize("lang", sorted(HISTORIES))
@pytest.mark.parametrize("size", BUDGETS)
def test_without_times_the_later_session_is_the_newer(untimed, lang: str, size: dict) -> None:
    history = HISTORIES[lang]
    times = {t.timestamp for t in untimed.turns(lang)}
    assert len(times) == 1  # one time for the whole import: only the order tells
    first = untimed.retrieve(lang, history.now, **size).hits[0].memory.text
    assert history.new in first and history.old not in first, first
