"""The Sokoban board: a fixed layout (walls, floor, targets) plus movable boxes and player.

Cells are flat indices `row * width + col` so moves are integer offsets; the border is
always wall, so a move never leaves the board. The same structure serves the generator,
the solver and the env, which keeps the three in exact agreement about the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

# Cell codes of gym-sokoban's room_state, so anchors read the same as in peer projects.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

MOVES = ("up", "down", "left", "right")

#: ASCII symbols (a tiny model's tokenizer may not know RAGEN's "√").
SYMBOLS = {WALL: "#", FLOOR: "_", TARGET: "O", BOX_ON_TARGET: "*", BOX: "X", PLAYER: "P", PLAYER_ON_TARGET: "S"}
LEGEND = "# wall, _ floor, O target, X box, * box on target, P player, S player on target"


def move_offsets(width: int) -> dict[str, int]:
    """Flat-index offset of each move on a board `width` cells wide."""
    return {"up": -width, "down": width, "left": -1, "right": 1}


@dataclass(frozen=True)
class Board:
    """One Sokoban position. `floor[i]` is 1 for any walkable cell (targets included)."""

    height: int
    width: int
    floor: bytes
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def codes(self) -> bytes:
        """The gym-sokoban room_state as bytes (row-major, one code per cell)."""
        cells = bytearray(FLOOR if f else WALL for f in self.floor)
        for t in self.targets:
            cells[t] = TARGET
        for b in self.boxes:
            cells[b] = BOX_ON_TARGET if b in self.targets else BOX
        cells[self.player] = PLAYER_ON_TARGET if self.player in self.targets else PLAYER
        return bytes(cells)

    def anchor(self) -> bytes:
        """History-free state key: the board shape followed by the cell codes."""
        return bytes((self.height, self.width)) + self.codes()

    def render(self) -> str:
        codes = self.codes()
        return "\n".join(
            "".join(SYMBOLS[c] for c in codes[r * self.width : (r + 1) * self.width]) for r in range(self.height)
        )

    def render_cells(self) -> str:
        """The grid inside its wall ring (every board has one: `from_text` and the generator
        enforce it), with a space before each symbol, so that each cell is one token.

        `render` packs runs of cells into BPE tokens of uneven width ("##__", "_#"), so the
        cell above the player sits a different number of tokens back on every board; here it
        is always one row's width back."""
        codes = self.codes()
        rows = [codes[r * self.width + 1 : (r + 1) * self.width - 1] for r in range(1, self.height - 1)]
        return "\n".join("".join(" " + SYMBOLS[c] for c in row) for row in rows)

    def describe_positions(self) -> str:
        """One line of relative positions and blocked moves, for small models.

        A 2-D grid flattened into text asks a tiny model to count characters to find
        "the cell above"; this line states the same facts directly (nothing the grid does
        not already show): where each box is from the player, where the nearest target is
        from that box, and which moves are impossible right now."""

        def offset(a: int, b: int) -> str:
            dr, dc = b // self.width - a // self.width, b % self.width - a % self.width
            vertical = f"down {dr}" if dr > 0 else f"up {-dr}" if dr < 0 else "row 0"
            horizontal = f"right {dc}" if dc > 0 else f"left {-dc}" if dc < 0 else "col 0"
            return f"{vertical} {horizontal}"

        def distance(a: int, b: int) -> int:
            return abs(a // self.width - b // self.width) + abs(a % self.width - b % self.width)

        parts = []
        for box in sorted(self.boxes):
            free_targets = [t for t in sorted(self.targets) if t not in self.boxes or t == box]
            target = min(free_targets or sorted(self.targets), key=lambda t: distance(box, t))
            parts.append(f"box {offset(self.player, box)}; target from box {offset(box, target)}")
        blocked = [m for m in MOVES if self.try_move(m)[0] is None]
        parts.append("blocked " + (" ".join(blocked) if blocked else "none"))
        return "; ".join(parts)

    def try_move(self, move: str) -> tuple[Board | None, str]:
        """Apply a move; returns (new board, "") or (None, why it is impossible)."""
        offset = move_offsets(self.width)[move]
        ahead = self.player + offset
        if not self.floor[ahead]:
            return None, f"a wall blocks {move}"
        if ahead not in self.boxes:
            return Board(self.height, self.width, self.floor, self.targets, self.boxes, ahead), ""
        beyond = ahead + offset
        if not self.floor[beyond]:
            return None, f"the box cannot be pushed {move} into a wall"
        if beyond in self.boxes:
            return None, f"the box cannot be pushed {move} into another box"
        boxes = (self.boxes - {ahead}) | {beyond}
        return Board(self.height, self.width, self.floor, self.targets, frozenset(boxes), ahead), ""

    def after(self, moves: list[str] | tuple[str, ...]) -> Board:
        """The board after a sequence of moves; ValueError at the first impossible one."""
        board = self
        for index, move in enumerate(moves):
            new_board, why = board.try_move(move)
            if new_board is None:
                raise ValueError(f"move {index} ({move}) is impossible: {why}")
            board = new_board
        return board

    @classmethod
    def from_anchor(cls, anchor: bytes) -> Board:
        """The position an `anchor()` was taken of (a logged trajectory keeps every turn's)."""
        if len(anchor) < 2 or len(anchor) != 2 + anchor[0] * anchor[1] or any(c not in SYMBOLS for c in anchor[2:]):
            raise ValueError(f"not a Sokoban anchor: {anchor[:16].hex()}...")
        height, width, codes = anchor[0], anchor[1], anchor[2:]
        return cls.from_text(
            "\n".join("".join(SYMBOLS[c] for c in codes[r * width : (r + 1) * width]) for r in range(height))
        )

    @classmethod
    def from_text(cls, text: str) -> Board:
        """Parse a rendered board (the SYMBOLS above); handy for tests and hand-made levels."""
        rows = [r for r in text.strip("\n").splitlines()]
        width = max(len(r) for r in rows)
        lookup = {s: c for c, s in SYMBOLS.items()}
        floor, targets, boxes, player = bytearray(), set(), set(), None
        for r, row in enumerate(rows):
            for c, ch in enumerate(row.ljust(width, "#")):
                code = lookup.get(ch)
                if code is None:
                    raise ValueError(f"unknown Sokoban symbol {ch!r}; legend: {LEGEND}")
                i = r * width + c
                floor.append(0 if code == WALL else 1)
                if code in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add(i)
                if code in (BOX, BOX_ON_TARGET):
                    boxes.add(i)
                if code in (PLAYER, PLAYER_ON_TARGET):
                    player = i
        if player is None:
            raise ValueError("board has no player (P or S)")
        height = len(rows)
        border = [
            i for i in range(height * width) if i < width or i >= (height - 1) * width or i % width in (0, width - 1)
        ]
        if any(floor[i] for i in border):
            raise ValueError("the board's border must be wall (#)")
        return cls(height, width, bytes(floor), frozenset(targets), frozenset(boxes), player)
