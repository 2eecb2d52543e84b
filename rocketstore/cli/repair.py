# SPDX-License-Identifier: Apache-2.0
"""`verify`, `recover`, `rebuild-cq` and `rebuild-index`: check a store, and repair it offline."""
import sys

from .common import index_options, print_json


def add_parsers(sub):
    v = sub.add_parser("verify", help="check every record, consume-queue unit, index entry, "
                                      "the checkpoint and config files (read-only); exit 1 on "
                                      "problems")
    v.add_argument("store_dir", help="store root")
    v.add_argument("--json", action="store_true", help="print the report as JSON")
    v.set_defaults(func=_verify)

    r = sub.add_parser("recover", parents=[index_options()],
                       help="run abnormal recovery offline: truncate a damaged tail, "
                            "re-dispatch what the queues miss")
    r.add_argument("store_dir", help="store root")
    r.add_argument("--dry-run", action="store_true",
                   help="only show what would be truncated and re-dispatched")
    r.add_argument("--json", action="store_true", help="print the plan or report as JSON")
    r.set_defaults(func=_recover)

    for name, what in (("rebuild-cq", "ConsumeQueues"), ("rebuild-index", "IndexFiles")):
        rb = sub.add_parser(name, parents=[index_options()],
                            help=f"delete and rebuild every one of the {what} from the "
                                 "CommitLog")
        rb.add_argument("store_dir", help="store root")
        rb.add_argument("--json", action="store_true", help="print the report as JSON")
        if name == "rebuild-cq":
            rb.add_argument("--cq-file-size", type=int, default=None,
                            help="bytes per ConsumeQueue file (default: the existing files', "
                                 "else 6000000)")
        rb.set_defaults(func=_rebuild)


def _verify(args):
    from .progress import progress_bar
    from ..store import MessageStore
    import os
    from ..fs import DEFAULT
    _, holder = DEFAULT.lock_holder(os.path.join(args.store_dir, "lock"))
    if holder:
        print(f"rocketstore verify: warning: the store is in use (pid {holder} holds its "
              f"lock): what it writes meanwhile may show as problems", file=sys.stderr)
    store = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        total = max(0, store.get_max_phy_offset() - max(0, store.get_min_phy_offset()))
        with progress_bar(total, "verify", unit="B") as bar:
            report = store.verify(bar.update)
    finally:
        store.shutdown()
    if args.json:
        print_json(report.to_dict())
    else:
        for problem in report.problems:
            print(problem)
        print(f"{report.records} records, {report.units} consume-queue units, "
              f"{report.index_entries} index entries checked: "
              f"{'OK' if report.ok else f'{len(report.problems)} problem(s)'}")
    return 0 if report.ok else 1


def _recover(args):
    """The plan first (computed read-only by the recovery code itself), then, unless
    --dry-run, the real run, reported in the plan's terms so the two can be compared."""
    import dataclasses
    from .. import repair
    from ..store import MessageStore
    geometry = dict(max_hash_slot_num=args.max_hash_slot_num, max_index_num=args.max_index_num)
    plan = repair.plan_recovery(args.store_dir, kernels=args.backend, **geometry)
    if args.json and args.dry_run:
        print_json(plan.to_dict())
        return 0
    if not args.json:
        print(f"scan from file {plan.start_file}: the CommitLog ends at {plan.process_offset} "
              f"({plan.stop_reason or 'clean'}); {plan.truncated_bytes} bytes past it would "
              f"be truncated")
        for queue, units in sorted(plan.truncated_units.items()):
            print(f"  consume queue {queue}: {units} unit(s) past the end would be dropped")
        print(f"{plan.redispatch_records} record(s) would be dispatched again: consume-queue "
              f"units {plan.units_before} -> {plan.units_after}, index entries "
              f"{plan.index_entries_before} -> {plan.index_entries_after}"
              + (f" (rebuilding index file(s) {', '.join(plan.index_files_rebuilt)})"
                 if plan.index_files_rebuilt else ""))
    if args.dry_run:
        print("dry run: nothing changed")
        return 0
    report = repair.recover(args.store_dir, kernels=args.backend, **geometry)
    after = MessageStore.open_read_only(args.store_dir, kernels=args.backend)
    try:
        units, entries = repair.store_counts(after.all_consume_queues(),
                                             after.index_service.index_file_list)
    finally:
        after.shutdown()
    result = dict(repair.camel_keys(dataclasses.asdict(report)), unitsBefore=plan.units_before,
                  unitsAfter=units, indexEntriesBefore=plan.index_entries_before,
                  indexEntriesAfter=entries)
    if args.json:
        print_json(result)
    else:
        print(f"recovered: {report.records} records scanned, {report.dispatched} dispatched, "
              f"CommitLog ends at {report.process_offset}; consume-queue units "
              f"{plan.units_before} -> {units}, index entries {plan.index_entries_before} -> "
              f"{entries}")
    return 0


def _rebuild(args):
    import dataclasses
    from .. import repair
    rebuild = (repair.rebuild_consume_queues if args.command == "rebuild-cq"
               else repair.rebuild_index)
    geometry = dict(max_hash_slot_num=args.max_hash_slot_num, max_index_num=args.max_index_num)
    if args.command == "rebuild-cq":
        report = rebuild(args.store_dir, kernels=args.backend, cq_file_size=args.cq_file_size,
                         **geometry)
    else:
        report = rebuild(args.store_dir, kernels=args.backend, **geometry)
    if args.json:
        print_json(repair.camel_keys(dataclasses.asdict(report)))
    else:
        print(f"{args.command}: {report.records} records scanned, {report.dispatched} "
              f"dispatched in {report.seconds:.2f} s")
    return 0
