"""Two graph questions about a client's grammar, answered in linear time without recursion
(the graphs are the client's: thousands of nodes, chains as deep as they like).

- `weighted_depth`: how deep a recursive compile from the roots can go: the most nodes on
  a path, where a strongly connected component (a cycle of references) counts all of
  its nodes (an upper bound on any path through it).
- `productive`: which nodes can produce a finite value. A node is a conjunction of
  clauses, each a disjunction of nodes; a node with no clause is productive, an empty
  clause never holds (the least fixpoint, by a worklist).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["productive", "weighted_depth"]


def weighted_depth(succ: Sequence[Sequence[int]], roots: Iterable[int]) -> int:
    """The most nodes on a path from one of `roots` in the graph `succ` (node -> successors),
    each strongly connected component counting all its nodes."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    sizes: list[int] = []
    depth: list[int] = []  # per component, in the order found (successors first)
    counter = 0
    for root in roots:
        if index[root] != -1:
            continue
        work = [(root, 0)]
        while work:
            v, k = work[-1]
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            edges = succ[v]
            if k < len(edges):
                work[-1] = (v, k + 1)
                w = edges[k]
                if index[w] == -1:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:  # v roots a component: every node above it on the stack
                c = len(sizes)
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = c
                    members.append(w)
                    if w == v:
                        break
                below = 0  # components reachable from here were all found before this one
                for w in members:
                    for x in succ[w]:
                        if comp[x] != c:
                            below = max(below, depth[comp[x]])
                sizes.append(len(members))
                depth.append(len(members) + below)
    return max((depth[comp[r]] for r in range(n) if index[r] != -1), default=0)


def productive(clauses: Sequence[Sequence[Sequence[int]]]) -> list[bool]:
    """Per node: whether it can produce a finite value (see the module's docstring)."""
    n = len(clauses)
    done = [False] * n
    missing = [len(cs) for cs in clauses]  # clauses not yet holding
    holds = [[False] * len(cs) for cs in clauses]
    users: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for v, cs in enumerate(clauses):
        for c, members in enumerate(cs):
            for m in members:
                users[m].append((v, c))
    work = [v for v in range(n) if missing[v] == 0]
    for v in work:
        done[v] = True
    while work:
        m = work.pop()
        for v, c in users[m]:
            if done[v] or holds[v][c]:
                continue
            holds[v][c] = True
            missing[v] -= 1
            if missing[v] == 0:
                done[v] = True
                work.append(v)
    return done
