// Package api is the HTTP control API of `tern vmm serve` (DESIGN §7): one
// VM per process, driven by a instance Controller.
//
//	PUT  /v1/instance                  ensure: validate, 201 at once, build in the background
//	                                   (init.method migration_target: migrate in from init.source)
//	GET  /v1/instance                  {id, state, gen, spec, disks, migration}
//	PUT  /v1/instance/state            {"requested":"run"|"stop"|"reboot"} → 204, or 409 wrong_state
//	GET  /v1/instance/state?after_gen=N long-poll (≤ 30 s) for {gen, state, migration}; 410 once gone
//	GET  /v1/instance/disks/{name}     replica states and repair progress
//	GET  /v1/instance/serial/history   {data, from_offset, next_offset}
//	GET  /v1/instance/serial           websocket: replay, then live, both directions; after a
//	                                   migration out one text message {"migrated_to":URL}
//	GET  /openapi.json, /metrics, /healthz
//
// Invariants:
//   - Every error is JSON {"error_code", "message"} (plus "state" for
//     wrong_state and "problems" for an invalid spec), unknown routes and
//     methods included. Bodies are limited to MaxBodyBytes (413).
//   - Ensure never waits for the instance: validation is synchronous and
//     reads only file metadata; memory, devices and volume activation
//     happen on the controller's goroutine. One live instance at a time:
//     another id, or the same id with another spec, is 409; the same
//     ensure again is 201; once destroyed or failed is observable a new
//     ensure starts a new one, its gens continuing past the old one's (it
//     waits, bounded, for the old owner goroutine's last moment after
//     publishing it, never answering instance_exists).
//   - After the instance is gone GET /v1/instance keeps answering with its
//     last snapshot until the next ensure; before any ensure it is 404
//     no_instance.
//   - Legality of state requests is decided only by instance.Decide.
//   - openapi.json describes exactly the routes of Server.Routes; the tests
//     validate real requests and responses against it.
//   - Close stops the live instance, waits until it is destroyed, and ends
//     every serial stream, leaving no goroutine behind. DrainWatchers then
//     waits, bounded by its ctx, until every connection that long-polled
//     has been given the final snapshot, so that a watcher between two
//     long-polls sees destroyed before the listener closes.
package api
