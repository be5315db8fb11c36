"""The dead letters screen: the state its widgets share, the poll that reads it, and the
actions.

The list refreshes live like everything else. Marks remember each row as it was last shown
(its lease_version): that is what an action is fenced on.
"""

from __future__ import annotations

from dataclasses import replace

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import var
from textual.widgets import ContentSwitcher

from outbox.operations.repair import Action, ActionResult, Seen
from outbox.plumbing.text import first_line
from outbox.tui import format as fmt
from outbox.tui.actions import ActionRequest
from outbox.tui.errors import DATABASE_ERRORS
from outbox.tui.poller import Poller
from outbox.tui.screens.base import BaseScreen
from outbox.tui.screens.dead.filter_bar import FilterBar
from outbox.tui.screens.dead.groups import GroupView, breakdown, with_group
from outbox.tui.screens.dead.listing import DeadList, Listing, read_listing
from outbox.tui.screens.dead.marks import Marks
from outbox.tui.screens.dead.rows import RowsView
from outbox.tui.screens.dead.summary import Counts, DeadSummary, View
from outbox.tui.screens.detail import DetailScreen, skip_notes
from outbox.views.dead_letters import DeadMessage, DeadPage, ErrorGroup
from outbox.views.filters import DeadFilter

VIEW_IDS: dict[View, str] = {"list": "dead-list", "groups": "error-groups"}


class DeadScreen(BaseScreen):
    SHOWS_FILTER_HELP = True
    DEFAULT_CSS = """
    DeadScreen > ContentSwitcher { height: 1fr; }
    DeadScreen.stale DataTable { text-opacity: 60%; }
    """
    BINDINGS = [
        Binding("enter", "open", "detail", show=False),
        Binding("slash", "filter", "filter"),
        Binding("g", "toggle_groups", "groups"),
        Binding("space", "mark", "mark", key_display="␣"),
        Binding("r", "requeue", "requeue"),
        Binding("R", "requeue_all", "requeue all", key_display="R"),
        Binding("s", "skip", "skip"),
        Binding("u", "unmark_all", "unmark all", show=False),
        Binding("right_square_bracket", "older", "older page", show=False),
        Binding("left_square_bracket", "newer", "newer page", show=False),
        Binding("t", "newest", "newest page (live)", show=False),
        Binding("x", "clear_filter", "clear filter", show=False),
        Binding("escape", "back", "back"),
    ]

    # The state the widgets share, bound down to them in `compose` (they report up with
    # messages). `always_update`: a filter applied again still starts over at the newest
    # page, and a page read again still redraws its ages.
    filter: var[DeadFilter] = var(DeadFilter, always_update=True, init=False)
    view: var[View] = var[View]("list", bindings=True, init=False)
    marks: var[Marks] = var(Marks, init=False)
    # What the last poll read.
    listing: var[Listing | None] = var(None, always_update=True, init=False)
    groups: var[tuple[ErrorGroup, ...] | None] = var(None, always_update=True, init=False)
    counts: var[Counts | None] = var(None, init=False)
    staleness: var[str] = var("", init=False)
    # The filter line: open (set again by `/`, it starts over), and what is wrong with it.
    filtering: var[bool] = var(False, always_update=True, toggle_class="filtering", init=False)
    filter_problem: var[str | None] = var(None, toggle_class="filter-error", init=False)

    def compose(self) -> ComposeResult:
        clock = self.outbox.clock
        yield from self.compose_top()
        yield DeadSummary(id="dead-header").data_bind(
            DeadScreen.filter,
            DeadScreen.view,
            DeadScreen.counts,
            DeadScreen.listing,
            DeadScreen.groups,
            DeadScreen.staleness,
            DeadScreen.marks,
        )
        with ContentSwitcher(initial=VIEW_IDS["list"]):
            yield DeadList(clock, id=VIEW_IDS["list"]).data_bind(
                DeadScreen.listing, DeadScreen.marks
            )
            yield GroupView(clock, id=VIEW_IDS["groups"]).data_bind(DeadScreen.groups)
        yield FilterBar(id="filter-bar").data_bind(
            DeadScreen.filter, open=DeadScreen.filtering, problem=DeadScreen.filter_problem
        )
        yield from self.compose_bottom()
        yield Poller(self.fetch, interval=self.outbox.poll_interval, name="dead")

    def on_mount(self) -> None:
        super().on_mount()
        self._shown_view().table.focus()

    @property
    def _rows(self) -> DeadList:
        return self.query_one(DeadList)

    def _shown_view(self) -> RowsView:
        return self._rows if self.view == "list" else self.query_one(GroupView)

    @property
    def page(self) -> DeadPage | None:
        """The page of the list shown."""
        return self.listing.page if self.listing is not None else None

    @property
    def before(self) -> int | None:
        """Where the page shown continues from (None: the newest page, live)."""
        return self.listing.before if self.listing is not None else None

    def highlighted(self) -> DeadMessage | None:
        return self._rows.highlighted()

    # -- data -------------------------------------------------------------------------------

    async def fetch(self) -> None:
        source, size = self.outbox.source, self.outbox.config.page_size
        # One filter, view and page for every query of this poll. The operator may change
        # any of them meanwhile: then nothing of this poll is shown (it would be the old
        # rows under the new label), and the change's own poll follows.
        current, view, wanted = self.filter, self.view, self._rows.wanted
        groups: tuple[ErrorGroup, ...] | None = None
        listing: Listing | None = None
        if view == "groups":
            groups = tuple(await source.error_groups(current))
            matching = sum(g.count for g in groups)
        else:
            listing = await read_listing(source, current, wanted, size)
            matching = await source.dead_count(current)
        dead = matching if current.is_empty() else await source.dead_count(DeadFilter())
        if (self.filter, self.view, self._rows.wanted) != (current, view, wanted):
            return
        if listing is not None:
            self.listing = listing
            self.marks = self.marks.as_shown(listing.page.messages)
        else:
            self.groups = groups
        self.counts = Counts(matching, dead)

    def show_staleness(self) -> None:
        self.staleness = self.stale_note()

    def refetch(self) -> None:
        for poller in self.query(Poller):
            poller.poll_now()

    def watch_filter(self, old: DeadFilter, new: DeadFilter) -> None:
        if new != old and self.marks:
            # Marks are rows the operator sees; under another filter they may not be shown.
            self.outbox.tell(f"{len(self.marks)} marks cleared: the filter changed")
            self.marks = Marks()
        self._rows.newest()
        self.refetch()

    def watch_view(self, view: View) -> None:
        self.query_one(ContentSwitcher).current = VIEW_IDS[view]
        self._shown_view().table.focus()
        self.refetch()

    # -- navigation -------------------------------------------------------------------------

    def action_open(self) -> None:
        if self.view == "groups":
            group = self.query_one(GroupView).highlighted()
            if group is not None:
                self.filter = with_group(self.filter, group.key)
                self.view = "list"
            return
        message = self.highlighted()
        if message is not None:
            self.app.push_screen(DetailScreen(message.id))

    def action_toggle_groups(self) -> None:
        self.view = "groups" if self.view == "list" else "list"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.view == "groups" and action in ("requeue", "skip", "mark", "unmark_all"):
            return False  # rows, not groups: R requeues a group
        return super().check_action(action, parameters)

    def action_older(self) -> None:
        if self.view == "list" and self._rows.older():
            self.refetch()

    def action_newer(self) -> None:
        if self.view == "list" and self._rows.newer():
            self.refetch()

    def action_newest(self) -> None:
        self._rows.newest()
        self.refetch()

    def action_back(self) -> None:
        if self.filtering:
            self._close_filter()
        elif self.view == "groups":
            self.view = "list"
        elif not self.filter.is_empty():
            self.action_clear_filter()
        else:
            self.app.pop_screen()

    # -- filter -----------------------------------------------------------------------------

    def action_filter(self) -> None:
        self.filtering = True

    def watch_filtering(self, editing: bool) -> None:
        if not editing:
            self._shown_view().table.focus()

    @on(FilterBar.Unreadable)
    def _filter_unreadable(self, event: FilterBar.Unreadable) -> None:
        self.filter_problem = event.problem

    @on(FilterBar.Entered)
    def _filter_entered(self, event: FilterBar.Entered) -> None:
        if event.filter.payload_path is None:
            self._close_filter()
            self.filter = event.filter
        else:
            self._check_then_filter(event.filter)

    @work(group="filter", exclusive=True, exit_on_error=False)
    async def _check_then_filter(self, new: DeadFilter) -> None:
        """A path only the database can read: ask it first, so that a typo is the filter's
        error here instead of a failing poll under the new filter."""
        try:
            problem = await self.outbox.source.check_filter(new)
        except DATABASE_ERRORS as exc:
            problem = f"cannot check it now: {first_line(exc)}"
        if problem is not None:
            self.filter_problem = problem
        elif self.filtering:
            self._close_filter()
            self.filter = new

    def _close_filter(self) -> None:
        self.filtering = False
        self.filter_problem = None

    def action_clear_filter(self) -> None:
        self.filter = DeadFilter()

    # -- marks and actions ------------------------------------------------------------------

    def action_mark(self) -> None:
        message = self.highlighted()
        if message is None or self.view != "list":
            return
        self.marks = self.marks.toggled(message.seen)
        self._rows.advance()

    def action_unmark_all(self) -> None:
        self.marks = Marks()

    def _selected(self) -> tuple[list[Seen], str] | None:
        """The marked rows, else the highlighted one, as the operator sees them."""
        if self.marks:
            seen = sorted(self.marks.values(), key=lambda s: -s.id)
            shown = {m.id for m in self.page.messages} if self.page else set()
            elsewhere = sum(1 for s in seen if s.id not in shown)
            what = f"{len(seen)} marked: " + fmt.one_line(", ".join(str(s.id) for s in seen), 60)
            if elsewhere:
                what += f" ({elsewhere} of them on other pages)"
            return seen, what
        message = self.highlighted()
        if message is None:
            return None
        return [message.seen], (
            f"message {message.id} ({message.aggregate_type}/{message.aggregate_id}, "
            f"{message.event_type})"
        )

    def _clear_marks(self, result: ActionResult) -> None:
        self.marks = self.marks.without(
            [*result.changed, *result.changed_meanwhile, *result.not_dead]
        )

    def _act_on_selected(self, action: Action) -> None:
        selected = self._selected()
        if selected is None:
            return
        seen, what = selected
        source = self.outbox.source

        async def explain() -> list[str]:
            return await skip_notes(source, seen)

        self.outbox.request(
            ActionRequest(
                action,
                what,
                recorded={"selection": "marked" if self.marks else "one"},
                seen=seen,
                explain=explain if action == "skip" else None,
                done=self._clear_marks,
            )
        )

    def action_requeue(self) -> None:
        self._act_on_selected("requeue")

    def action_skip(self) -> None:
        if self.view == "list":
            self._act_on_selected("skip")

    def action_requeue_all(self) -> None:
        """Everything matching the filter, or the highlighted error group."""
        target = self.filter
        if self.view == "groups":
            group = self.query_one(GroupView).highlighted()
            if group is None:
                return
            target = with_group(self.filter, group.key)
        description = target.describe()
        source = self.outbox.source
        if target.error_group is not None:
            what = f"every dead message in the error group {target.error_group!r}"
            rest = replace(target, error_group=None).describe()
            what += f" matching {rest}" if rest else ""
        elif description:
            what = f"every dead message matching {description}"
        else:
            what = "every dead message"

        async def load() -> list[Seen]:
            return await source.targets(target)

        async def explain() -> list[str]:
            return breakdown(await source.error_groups(target))

        self.outbox.request(
            ActionRequest(
                "requeue",
                what,
                recorded={"query": description, "filter": target.to_json()},
                load=load,
                done=self._clear_marks,
                # Everything, permanent failures included: show what it is, type the count.
                explain=explain if target.is_empty() else None,
                typed=target.is_empty(),
            )
        )
