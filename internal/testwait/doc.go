// Package testwait is how tern's tests wait: for a condition, woken by
// the change channel the code under test offers (On) or, where nothing
// announces a change, on a short ticker (Poll), and for the goroutines a
// test started to have returned (Goroutines), always with a deadline.
//
// It is for tests only; no production package imports it.
package testwait
