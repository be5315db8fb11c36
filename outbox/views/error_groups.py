"""Error groups: what varies between two occurrences of one failure becomes a placeholder.

The normaliser is an SQL expression (PostgreSQL's regular expressions), so dead rows are
grouped, counted and filtered by group in the database, over the `outbox_dead` index.
"""

from __future__ import annotations

from psycopg import sql

# Applied in order by `regexp_replace(..., 'g')` (PostgreSQL's regular expressions): what
# varies between two occurrences of the same failure becomes a placeholder, so that
# "timeout after 10.2s for order 41" and "... 10.7s for order 97" are one group. HTTP status
# codes are kept on purpose: "HTTP 422" and "HTTP 503" are different failures, not values.
ERROR_RULES: tuple[tuple[str, str], ...] = (
    (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", "<uuid>"),
    # JSON keys ("status": ...) are structure, not values: park their quotes on \x01 so the
    # next rule, which blanks quoted values, pairs quotes correctly.
    (r'"((?:[^"\\]|\\.)*)"(\s*:)', "\x01\\1\x01\\2"),
    (r'"(?:[^"\\]|\\.)*"', "<str>"),
    # Single-quoted values, but not apostrophes inside words (can't, worker's).
    (r"(?<![[:alnum:]])'[^']*'(?![[:alnum:]])", "<str>"),
    ("\x01", '"'),
    # Ids: 0x..., or 8 or more hex digits with at least one digit. Digits alone count too,
    # since a random hex id is sometimes all digits (one in forty of 8 characters) and must
    # stay in its failure's group; so a number of 8 or more digits is an id here as well.
    (r"\m0[xX][0-9a-fA-F]+\M|\m(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\M", "<hex>"),
    # Numbers, also inside ids (order-42, req_7) and dotted (10.0.0.5, 1.5s).
    (r"(?<![0-9])(?<!HTTP )[0-9]+(?:\.[0-9]+)*", "<n>"),
    (r"\s+", " "),
)
GROUP_KEY_LENGTH = 240  # long error bodies group on their beginning


def normalised_error(column: sql.Composable) -> sql.Composable:
    expression: sql.Composable = sql.SQL("coalesce({c}, '')").format(c=column)
    for pattern, replacement in ERROR_RULES:
        expression = sql.SQL("regexp_replace({e}, {p}, {r}, 'g')").format(
            e=expression, p=sql.Literal(pattern), r=sql.Literal(replacement)
        )
    return sql.SQL("left(btrim({e}), {n})").format(e=expression, n=sql.Literal(GROUP_KEY_LENGTH))


ERROR_GROUP = normalised_error(sql.Identifier("last_error"))
