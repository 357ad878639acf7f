"""The concepts page's workshop (``concepts/optimization.md``): its demonstrations, figures and
sweeps."""
