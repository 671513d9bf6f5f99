"""Who may do what: API tokens and their scopes, browser sessions, sign-in."""
