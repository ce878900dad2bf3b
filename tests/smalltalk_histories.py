"""A user's chats with an assistant in five languages, for the small-talk rule (issue 38).

Each history is twelve sessions as an app stores them: the user opens with a greeting, asks
for something or tells something about themselves, the assistant answers, the user thanks it
and the assistant replies. The greetings and thanks are the few phrases a person reuses (each
comes back every few sessions, as in real chats); every fact is said once. `SMALL` lists turns
of each history that are small talk, `SAID` short turns that state a fact and must never be
taken for small talk.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _Language:
    greet: tuple[str, ...]  # the user's openings
    hello: tuple[str, ...]  # the assistant's answers to them
    thank: tuple[str, ...]  # the user's thanks and goodbyes
    reply: tuple[str, ...]  # the assistant's answers to those
    talk: tuple[tuple[str, str], ...]  # (user, assistant): what each session is about


_EN = _Language(
    greet=("Hi!", "Hi there!", "Hello again!", "Hey, good morning!"),
    hello=("Hello! How can I help you today?", "Hi! What's on your mind?", "Hello! How are you?"),
    thank=("Thanks a lot!", "Great, thanks!", "Got it, thanks!", "Okay, thanks. Bye!"),
    reply=("You're welcome!", "Glad to help. Have a nice day!", "Anytime!"),
    talk=(
        ("I need a dinner idea for tonight, something quick.", "A green curry is ready in 20 min."),
        ("I'm allergic to peanuts.", "Noted: I'll leave satay sauce and peanut oil out."),
        ("My cat is called Miso.", "Lovely name! How old is she?"),
        ("She is two and scratches the sofa every day.", "A tall scratching post next to it."),
        ("I moved to Berlin last month for a new job.", "Congratulations on the move!"),
        ("I work as a nurse at the Charité, mostly nights.", "Keep a steady sleep routine."),
        ("What should I get my sister Lea? She plays the piano.", "Tickets to a recital."),
        ("I'm training for a half marathon in October.", "Build up your long run slowly."),
        ("Can you explain what a Roth IRA is?", "A retirement account funded after tax."),
        ("Which book should I read on the train?", "Try a short novel, like Klara and the Sun."),
        ("My favourite food is sushi.", "Then try the omakase place near the station."),
        ("How do I keep basil alive indoors?", "Bright window, water when the soil is dry."),
    ),
)

_NO = _Language(
    greet=("Hei!", "Hei igjen!", "Hei hei!", "God morgen!"),
    hello=(
        "Hei! Hva kan jeg hjelpe deg med i dag?",
        "Hei! Hvordan går det?",
        "Hei! Hva lurer du på?",
    ),
    thank=("Tusen takk!", "Takk for hjelpen!", "Supert, takk!", "Takk, ha det!"),
    reply=("Bare hyggelig!", "Lykke til!", "Ha det bra!"),
    talk=(
        ("Jeg trenger en middagsidé til i kveld.", "Ovnsbakt laks med poteter er enkelt."),
        ("Jeg bor i Oslo.", "Så fint! Trives du i byen?"),
        ("Katten min heter Pus.", "For et søtt navn! Hvor gammel er hun?"),
        ("Jeg jobber som lærer på en barneskole.", "Et viktig yrke. Hvilket trinn har du?"),
        ("Søsteren min elsker jazz, hva kan jeg gi henne?", "En billett til en jazzklubb."),
        ("Jeg er allergisk mot nøtter.", "Notert, jeg holder nøtter unna oppskriftene."),
        ("Jeg trener til et halvmaraton i september.", "Bygg opp langturen rolig."),
        ("Hvordan holder jeg basilikum i live inne?", "Lyst vindu og vann når jorda er tørr."),
        ("Kan du forklare hva en indeksfond er?", "Et fond som følger en hel børsindeks."),
        ("Hvilken bok bør jeg lese på toget?", "Prøv en kort roman av Jon Fosse."),
        ("Favorittmaten min er sushi.", "Da bør du prøve stedet ved Aker Brygge."),
        ("Vi skal på hyttetur til Hemsedal i påsken.", "Husk brodder og ekstra ullsokker."),
    ),
)

_FR = _Language(
    greet=("Bonjour !", "Salut !", "Bonjour, ça va ?", "Coucou !"),
    hello=(
        "Bonjour ! Comment puis-je vous aider ?",
        "Salut ! Qu'est-ce qui vous amène ?",
        "Bonjour ! Que puis-je faire pour vous ?",
    ),
    thank=("Merci beaucoup !", "D'accord, merci !", "Super, merci !", "Merci, bonne journée !"),
    reply=("Je vous en prie !", "Avec plaisir !", "Bonne journée à vous !"),
    talk=(
        ("Je cherche une idée de dîner pour ce soir.", "Un gratin de légumes, simple et rapide."),
        ("Mon chat s'appelle Miso.", "Joli nom ! Quel âge a-t-il ?"),
        ("Il griffe le canapé tous les jours.", "Un grand griffoir près du canapé aidera."),
        ("J'habite à Lyon depuis deux ans.", "Lyon est une belle ville."),
        ("Je suis infirmière à l'hôpital Édouard-Herriot.", "Gardez un sommeil régulier."),
        ("Quel cadeau pour ma sœur ? Elle adore le piano.", "Des places pour un récital."),
        ("Je suis allergique aux arachides.", "C'est noté, pas d'arachides dans les recettes."),
        ("Je prépare un semi-marathon pour octobre.", "Augmentez la sortie longue peu à peu."),
        ("Comment garder du basilic en intérieur ?", "Une fenêtre lumineuse, peu d'eau."),
        ("Quel livre lire dans le train ?", "Un court roman d'Annie Ernaux."),
        ("Mon plat préféré, ce sont les sushis.", "Essayez le comptoir près de la gare."),
        ("On part à Biarritz en août.", "Pensez à réserver le surf à l'avance."),
    ),
)

_DE = _Language(
    greet=("Hallo!", "Hallo, guten Morgen!", "Hi!", "Servus!"),
    hello=(
        "Hallo! Wie kann ich dir helfen?",
        "Hallo! Was kann ich für dich tun?",
        "Guten Morgen! Wie geht es dir?",
    ),
    thank=("Danke schön!", "Alles klar, danke!", "Super, vielen Dank!", "Danke, tschüss!"),
    reply=("Gern geschehen!", "Gern!", "Tschüss, bis bald!"),
    talk=(
        ("Ich brauche eine Idee fürs Abendessen.", "Nudeln mit Tomatensoße gehen schnell."),
        ("Ich wohne in Hamburg, in der Nähe vom Hafen.", "Schöne Gegend!"),
        ("Mein Hund heißt Bruno.", "Ein schöner Name! Wie alt ist er?"),
        ("Er zieht an der Leine, sobald er Katzen sieht.", "Übe kurze Strecken mit ihm."),
        ("Ich arbeite als Bäckerin und stehe um vier Uhr auf.", "Ein fester Schlafrhythmus hilft."),
        ("Ich bin allergisch gegen Erdnüsse.", "Notiert, ich lasse Erdnüsse weg."),
        ("Meine Schwester liebt Jazz. Was schenke ich ihr?", "Karten für einen Jazzclub."),
        ("Ich trainiere für einen Halbmarathon im Oktober.", "Steigere den langen Lauf langsam."),
        ("Wie halte ich Basilikum in der Wohnung am Leben?", "Helles Fenster, wenig Wasser."),
        ("Welches Buch soll ich im Zug lesen?", "Einen kurzen Roman von Jenny Erpenbeck."),
        ("Mein Lieblingsessen ist Sushi.", "Dann probier das Lokal an der Schanze."),
        ("Wir fahren im August an die Ostsee.", "Buch die Ferienwohnung bald."),
    ),
)

_ES = _Language(
    greet=("¡Hola!", "¡Hola, buenos días!", "¡Buenas!", "¡Hola de nuevo!"),
    hello=("¡Hola! ¿En qué puedo ayudarte?", "¡Hola! ¿Qué tal?", "¡Buenos días! ¿Cómo estás?"),
    thank=("¡Muchas gracias!", "¡Genial, gracias!", "Vale, ¡gracias!", "¡Gracias, adiós!"),
    reply=("¡De nada!", "¡Con gusto!", "¡Adiós, que vaya bien!"),
    talk=(
        ("Necesito una idea para cenar esta noche.", "Un salmón al horno con patatas."),
        ("Vivo en Madrid.", "¡Qué bien! ¿Qué quieres saber de la ciudad?"),
        ("Mi perro se llama Toby.", "¡Qué nombre tan bonito! ¿Cuántos años tiene?"),
        ("Trabajo como profesora de música en un colegio.", "Qué bonito trabajo."),
        ("Soy alérgica a los cacahuetes.", "Entendido, nada de cacahuetes en las recetas."),
        ("¿Qué le regalo a mi hermana? Le encanta el piano.", "Entradas para un recital."),
        ("Estoy entrenando para una media maratón en octubre.", "Aumenta la tirada larga."),
        ("¿Cómo mantengo la albahaca viva en casa?", "Ventana luminosa y poca agua."),
        ("¿Qué libro leo en el tren?", "Una novela corta de Rosa Montero."),
        ("Mi comida favorita es el sushi.", "Prueba el sitio cerca de la estación."),
        ("En agosto vamos a Cádiz.", "Reserva pronto el alojamiento."),
        ("¿Me explicas qué es un fondo indexado?", "Un fondo que sigue a un índice entero."),
    ),
)


def _sessions(lang: _Language) -> list[list[tuple[str, str]]]:
    out = []
    for i, (said, answer) in enumerate(lang.talk):
        out.append(
            [
                ("user", lang.greet[i % len(lang.greet)]),
                ("assistant", lang.hello[i % len(lang.hello)]),
                ("user", said),
                ("assistant", answer),
                ("user", lang.thank[i % len(lang.thank)]),
                ("assistant", lang.reply[i % len(lang.reply)]),
            ]
        )
    return out


_ALL = {"en": _EN, "no": _NO, "fr": _FR, "de": _DE, "es": _ES}

#: Each language's history: twelve sessions of `(role, text)`.
HISTORIES = {code: _sessions(lang) for code, lang in _ALL.items()}

#: Turns of each history that are small talk: every greeting and thanks, and the replies.
SMALL = {code: [*lang.greet, *lang.hello, *lang.thank, *lang.reply] for code, lang in _ALL.items()}

#: A question each history answers, and the word of its answer.
ASKED = {
    "en": ("What am I allergic to?", "peanuts"),
    "no": ("Hva er jeg allergisk mot?", "nøtter"),
    "fr": ("Comment s'appelle mon chat ?", "Miso"),
    "de": ("Wo wohne ich?", "Hamburg"),
    "es": ("¿Dónde vivo?", "Madrid"),
}

#: Short turns of each history that state a fact.
SAID = {
    "en": ["I'm allergic to peanuts.", "My cat is called Miso.", "My favourite food is sushi."],
    "no": ["Jeg bor i Oslo.", "Katten min heter Pus.", "Jeg er allergisk mot nøtter."],
    "fr": ["Mon chat s'appelle Miso.", "J'habite à Lyon depuis deux ans."],
    "de": ["Ich wohne in Hamburg, in der Nähe vom Hafen.", "Mein Hund heißt Bruno."],
    "es": ["Vivo en Madrid.", "Soy alérgica a los cacahuetes.", "Mi perro se llama Toby."],
}
