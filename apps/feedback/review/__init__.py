"""The review of people's labels: the owner accepts, rejects and resolves disagreements
(`services`, read by `selectors`, served to the API by `api`; the page is
apps.feedback.review.views), and a person takes back or revises their own labels (`revise`)."""
