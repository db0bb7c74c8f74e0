def f0(x):
    return x + 0


def f1(x):
    return x + 1


def f2(x):
    return x + 2


def f3(x):
    return x + 3


def f4(x):
    return x + 4


def f5(x):
    return x + 5


def f6(x):
    return x + 6


class K:
    def m(self):
        return 1
