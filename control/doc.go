// Package control is tern's orchestrator: the records of hosts,
// instances, vmms, migrations, regions and network mappings kept in etcd,
// the placement of instances and regions, the sagas that start, stop and
// migrate instances, the drain of a host, and the rules that settle the
// end of a migration from both sides' reports.
//
// Invariants:
//   - Every record update is one etcd transaction conditioned on the mod
//     revision of every record it read (Store.Commit): two writers never
//     both win, and a stale writer retries from fresh records.
//   - A vmm record's generation is the vmm's own (relayed by its agent):
//     a report whose generation is not above the record's changes
//     nothing, so late, duplicated and reordered reports leave the
//     records as the newest one made them.
//   - The end of a migration is decided only by Settle, a pure function
//     of both sides' latest reports: an instance never has two running
//     vmms and never none while one runs.
//   - A saga records each step in etcd before acting; steps are
//     idempotent, so a control process that restarts (or a new leader)
//     resumes every saga in flight from its record, or unwinds it.
package control
