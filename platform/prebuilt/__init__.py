"""The built-in models, built once by the site and served to nodes (sapo_node.prebuilt, docs/node.md)."""
