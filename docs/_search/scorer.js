// The site's search scorer (conf.py: html_search_scorer). Sphinx's default weights, with one
// change: a section whose title holds the whole query (a "title" result) ranks above a page that
// only has each of the query's words somewhere in its headings. Without it, a query such as
// "loss scaling" lists every page with "loss" in one heading and "scale" in another, in
// alphabetical order, before the section that teaches it.
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    return kind === "title" ? score + 10 : score;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: {
    0: 15,
    1: 5,
    2: -5,
  },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
