// A snippet as an agent might send it: top-level await works, console goes to stdout.
const primes = [];
for (let n = 2; primes.length < 10; n++) {
  if (primes.every((p) => n % p !== 0)) primes.push(n);
}
await Promise.resolve();
console.log("first ten primes:", primes.join(" "));
console.log("sum:", primes.reduce((a, b) => a + b, 0));
