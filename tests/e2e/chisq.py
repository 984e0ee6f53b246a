"""Two-sample chi-square homogeneity test shared by the MTP distribution tests."""
import torch


def homogeneity_p(a, b):
    """Chi-square two-sample test of Counters a and b; cells with small expected counts are pooled.
    Returns (p, chi2, degrees of freedom, cells)."""
    na, nb = sum(a.values()), sum(b.values())
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    cells, rest = [], [0, 0]
    for k in keys:
        tot = a[k] + b[k]
        if min(tot * na, tot * nb) / (na + nb) >= 5:
            cells.append((a[k], b[k]))
        else:
            rest[0] += a[k]
            rest[1] += b[k]
    if sum(rest) > 0:
        cells.append(tuple(rest))
    chi2 = 0.0
    for ca, cb in cells:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        chi2 += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    df = max(len(cells) - 1, 1)
    p = float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                      torch.tensor(chi2 / 2.0, dtype=torch.float64)))
    return p, chi2, df, len(cells)
