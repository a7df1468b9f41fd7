package guests

//go:generate go run ./internal/gen -src src -out elf
