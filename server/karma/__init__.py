"""The review step: outcomes proposed for Karma, verified by a person or by the served model, and the
accepted ones merged into the Karma of a session's prompts (`karma_review.py`; routes in
server/routes/karma_routes.py; rows in xdb/karma_reviews.py)."""
