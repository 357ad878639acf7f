"""The concepts page's demonstrations and figures."""
