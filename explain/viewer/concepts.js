/* The concept atlas's page (explain/viewer/concept_page.py): search, layer and sort over the
 * concept cards the page holds; plain JavaScript, no library. */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var cards = Array.prototype.slice.call(document.querySelectorAll("article.concept"));
  function key(card, sort) {
    if (sort === "top") return -(+card.dataset.top);
    if (sort === "relevance") return -(+card.dataset.relevance);
    return +card.dataset.channel;
  }
  function apply() {
    var text = $("search").value.trim().toLowerCase(), layer = $("layer").value, sort = $("sort").value, shown = 0;
    document.querySelectorAll("section.layer").forEach(function (section) {
      var inLayer = !layer || section.dataset.layer === layer;
      section.hidden = !inLayer;
      var mine = cards.filter(function (card) { return section.contains(card); });
      mine.sort(function (a, b) { return key(a, sort) - key(b, sort) || a.dataset.channel - b.dataset.channel; });
      var grid = section.querySelector(".concepts");
      mine.forEach(function (card) {
        card.hidden = !inLayer || (text !== "" && card.dataset.search.indexOf(text) < 0);
        if (!card.hidden) shown++;
        grid.appendChild(card);
      });
    });
    $("shown").textContent = shown.toLocaleString() + " of " + cards.length.toLocaleString() + " concepts shown";
  }
  $("controls").addEventListener("input", apply);
  $("controls").addEventListener("change", apply);
  apply();
  // a link to one concept (index.html#layer4:42, from a run's explorer) shows it, whatever the filters
  var target = null;
  try {
    target = window.location.hash && document.getElementById(decodeURIComponent(window.location.hash.slice(1)));
  } catch (error) {}  // a malformed fragment (#%) shows the page from its top
  if (target) target.scrollIntoView();
  document.body.dataset.ready = "1";
})();
