"""Small word lists for the language probes: which words of a French reply are French at all.

The field notes' Width50 build kept French *knowledge* ("La Revolution francaise a commence en" ->
1789) but wrote non-words ("cunce", "s'fotrenci", "zocneine"). No dictionary ships in the
image, so the French probe asks two cheap questions instead: are the function words of
French there (a reply in English or in word salad has few), and which words are unknown.
Unknown is not wrong (a 400-word list misses most nouns); the probe reports them so a person
can see "cunce" at a glance, and fails only when most of the reply is unknown.
"""

from __future__ import annotations

# Articles, pronouns, prepositions, conjunctions, auxiliaries and the commonest verbs, nouns,
# adjectives and adverbs of written French, lower case, elisions without the apostrophe
# split off (`l'`, `d'`, `qu'` are their own entries).
FRENCH_FUNCTION = frozenset("""
le la les l' un une des du de d' au aux ce cet cette ces ceci cela ça c' mon ma mes ton ta tes
son sa ses notre nos votre vos leur leurs je j' tu il elle on nous vous ils elles me m' te t'
se s' lui eux moi toi soi y en qui que qu' quoi dont où lequel laquelle lesquels
et ou mais donc or ni car si comme quand lorsque puisque parce
à dans par pour sur sous avec sans chez entre vers contre depuis pendant avant après
selon malgré parmi jusque jusqu' près loin devant derrière
ne n' pas plus moins très trop peu aussi bien mal déjà encore toujours jamais souvent
ici là alors ainsi enfin puis ensuite même tout toute tous toutes autre autres chaque
plusieurs quelque quelques aucun aucune certains certaines tel telle tels telles
""".split())

FRENCH_COMMON = FRENCH_FUNCTION | frozenset("""
est sont être été étais était étaient suis es sommes êtes sera seront serait fut
a ai as avons avez ont avoir eu avait avaient aura auront aurait
fait faire fais faisons faites font faisait dit dire dis disent peut peux pouvons pouvez
peuvent pouvait pourrait doit dois devons devez doivent devait devrait va vais vas allons
allez vont aller allait voir vu voit voient savoir sait sais savent venir vient viennent
venu prendre prend prennent pris mettre met mis donner donne donné trouver trouve trouvé
parler parle penser pense aimer aime passer passe rester reste devenir devient devenu
commencer commence commencé connaître connaît croire croit vivre vit vécu écrire écrit
lire lit appeler appelle appelé porter porte montrer montre offrir offre ouvrir ouvert
an ans année années jour jours temps fois monde vie homme hommes femme femmes enfant
enfants pays ville villes rue maison gens chose choses partie place histoire siècle
siècles guerre paix état peuple roi reine église art arts musée musées monument monuments
capitale france français française françaises europe paris fleuve seine tour eiffel
révolution république nation culture langue travail eau terre ciel soleil nuit matin
soir mer montagne famille ami amis amour cœur main tête œil yeux voix mot mots nom idée
grand grande grands grandes petit petite petits petites nouveau nouvelle nouveaux beau
belle beaux bon bonne bons premier première dernier dernière long longue haut haute
vieux vieille jeune ancien ancienne célèbre important importante nombreux nombreuses
seul seule vrai vraie possible différent différents général politique social sociale
historique moderne centre nord sud ouest
beaucoup vraiment surtout notamment également environ presque seulement
hui hier demain maintenant tôt tard longtemps parfois
un deux trois quatre cinq six sept huit neuf dix cent mille millions
""".split())


def is_cjk(ch: str) -> bool:
    """CJK unified ideographs (incl. extension A) and the CJK symbols/punctuation block."""
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x3000 <= o <= 0x303F or 0xFF00 <= o <= 0xFFEF


def cjk_ratio(text: str) -> float:
    """Share of the reply's letters (and CJK punctuation) that are CJK."""
    letters = [c for c in text if c.isalpha() or is_cjk(c)]
    return sum(1 for c in letters if is_cjk(c)) / len(letters) if letters else 0.0
