"""The raters: how far each can be trusted, measured from the run's own feedback
(`reliability`), and the API's raters figures (`api`; the pages are apps.feedback.raters_views)."""
