"""A tqdm progress bar when tqdm is installed, else the plain loop: the examples'
one optional dependency for monitoring (tqdm is not required to run them)."""


def progress(iterable, disable=False, **kwargs):
    """tqdm(iterable, **kwargs), or an object with the same loop and the three
    methods the examples call (set_postfix, write, close) when tqdm is missing or
    the bar is disabled (ranks other than 0)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _Plain(iterable)
    return tqdm(iterable, disable=disable, **kwargs)


class _Plain:
    def __init__(self, iterable):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def set_postfix(self, **_):
        pass

    def write(self, text):
        print(text, flush=True)

    def close(self):
        pass
