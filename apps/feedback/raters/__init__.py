"""The raters: how far each can be trusted, measured from the run's own feedback
(`reliability`), and the API's raters figures (`figures`, read by the API `api` and the pages `views`, with their `urls`)."""
