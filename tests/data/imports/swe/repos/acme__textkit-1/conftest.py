# Puts the repository root on sys.path, so that `import textkit` works however pytest is started.
