"""The source article's scenario: one long document with a chat session asking beside it, then four sessions.

Meant with the document lengths of the article and one document per user:
    locust -f loadtests/locustfile.py,loadtests/shapes/article.py --headless --host URL \\
        --doc-tokens 130000,100000,93098,70689 --docs-per-user 1 --doc-followups 1 --think-s 7.3
"""

from loadtests.settings import LoadSettings
from loadtests.shapes.timeline import StagedShape
from loadtests.stages import Stage, article_stages


class ArticleShape(StagedShape):
    chat_users_fixed = 1

    def stages(self, s: LoadSettings) -> list[Stage]:
        return article_stages(s)
