// Click a header of a table.sortable to sort its rows (numbers numerically, "—" last).
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.classList.add("sortable");
    th.addEventListener("click", function () {
      var body = table.tBodies[0];
      var asc = th.dataset.dir !== "asc";
      th.dataset.dir = asc ? "asc" : "desc";
      var key = function (tr) {
        var t = tr.cells[col].dataset.v !== undefined ? tr.cells[col].dataset.v : tr.cells[col].textContent;
        var x = parseFloat(t);
        return isNaN(x) ? t : x;
      };
      Array.from(body.rows).sort(function (a, b) {
        var x = key(a), y = key(b);
        if (typeof x !== typeof y) { return typeof x === "number" ? -1 : 1; }
        return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
      }).forEach(function (tr) { body.appendChild(tr); });
    });
  });
});
