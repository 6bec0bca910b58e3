"""Shortening and wrapping text to a width."""


def truncate(text: str, width: int, placeholder: str = "...") -> str:
    """Return text shortened to at most width characters.

    Text that fits in width is returned unchanged. Longer text is cut and ends with
    placeholder, the result being exactly width characters long.
    """
    if width < len(placeholder):
        raise ValueError(f"width {width} is shorter than the placeholder {placeholder!r}")
    if len(text) < width:
        return text
    return text[: width - len(placeholder)] + placeholder


def wrap(text: str, width: int) -> list:
    """Split text into lines of at most width characters, breaking between words.

    A word longer than width gets a line of its own.
    """
    if width < 1:
        raise ValueError("width must be positive")
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
